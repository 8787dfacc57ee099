from shop.pricing import line_price


class Cart:
    def __init__(self):
        self.lines = []

    def add(self, sku, quantity, unit_price):
        self.lines.append((sku, quantity, unit_price))

    def subtotal(self):
        return sum(line_price(quantity, unit_price) for _, quantity, unit_price in self.lines)
