import unittest

from games.fizzbuzz import fizzbuzz


class TestFizzBuzzHidden(unittest.TestCase):
    def test_fizzbuzz(self):
        self.assertEqual(fizzbuzz(45), "FizzBuzz")
        self.assertEqual(fizzbuzz(30), "FizzBuzz")
    def test_buzz_and_number(self):
        self.assertEqual(fizzbuzz(20), "Buzz")
        self.assertEqual(fizzbuzz(7), "7")
