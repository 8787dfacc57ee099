import unittest

from textutil.palindrome import is_palindrome


class TestPalindrome(unittest.TestCase):
    def test_plain(self):
        self.assertTrue(is_palindrome("racecar"))
