import argparse

from shop.pricing import total_with_tax
from shop.utils.dates import today


def main():
    parser = argparse.ArgumentParser(prog="shop")
    parser.add_argument("subtotal", type=float)
    parser.add_argument("--country", default="DE")
    args = parser.parse_args()
    print(today(), total_with_tax(args.subtotal, args.country))
