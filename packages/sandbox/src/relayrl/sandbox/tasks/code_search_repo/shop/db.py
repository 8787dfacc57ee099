import sqlite3

from shop.config import DATABASE_URL


def connect():
    return sqlite3.connect(DATABASE_URL.removeprefix("sqlite:///"))


def save_order(order_id, total):
    with connect() as connection:
        connection.execute("INSERT INTO orders VALUES (?, ?)", (order_id, total))
