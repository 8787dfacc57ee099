import unittest

from textutil.words import word_count


class TestWords(unittest.TestCase):
    def test_spaces(self):
        self.assertEqual(word_count("a b  c"), 3)
