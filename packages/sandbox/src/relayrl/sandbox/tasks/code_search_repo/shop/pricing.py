from shop.tax import vat

BULK_DISCOUNT = 0.05


def line_price(quantity, unit_price):
    price = quantity * unit_price
    if quantity >= 10:
        price *= 1 - BULK_DISCOUNT
    return price


def total_with_tax(subtotal, country):
    return subtotal + vat(subtotal, country)
