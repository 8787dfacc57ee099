import os

DATABASE_URL = os.environ.get("SHOP_DATABASE_URL", "sqlite:///shop.db")
CURRENCY = os.environ.get("SHOP_CURRENCY", "EUR")
