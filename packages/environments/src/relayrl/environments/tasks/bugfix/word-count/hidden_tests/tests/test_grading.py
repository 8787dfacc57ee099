import unittest

from textutil.words import word_count


class TestWordsHidden(unittest.TestCase):
    def test_newlines_and_tabs(self):
        self.assertEqual(word_count("alpha\nbeta\tgamma delta"), 4)
    def test_empty(self):
        self.assertEqual(word_count("  \n "), 0)
