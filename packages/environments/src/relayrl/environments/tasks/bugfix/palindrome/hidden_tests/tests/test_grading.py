import unittest

from textutil.palindrome import is_palindrome


class TestPalindromeHidden(unittest.TestCase):
    def test_case(self):
        self.assertTrue(is_palindrome("A man, a plan, a canal: Panama"))
    def test_not(self):
        self.assertFalse(is_palindrome("relayrl"))
