import datetime


def today():
    return datetime.date.today().isoformat()
