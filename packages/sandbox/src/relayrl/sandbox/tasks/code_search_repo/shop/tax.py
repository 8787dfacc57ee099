RATES = {"DE": 0.19, "FR": 0.20, "NL": 0.21}


def vat(amount, country):
    return amount * RATES.get(country, 0.0)
