import json
import os
from http.server import BaseHTTPRequestHandler

from shop.cart import Cart
from shop.db import save_order


class OrderHandler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cart = Cart()
        for line in body["lines"]:
            cart.add(line["sku"], line["quantity"], line["unit_price"])
        save_order(body["id"], cart.subtotal())
        self.send_response(201)
        self.end_headers()
        if os.environ.get("SHOP_DEBUG"):
            print("order", body["id"])
