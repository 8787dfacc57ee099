import unittest

from search.bisect_search import find


class TestFindHidden(unittest.TestCase):
    def test_last_and_first(self):
        self.assertEqual(find([2, 4, 6, 8, 10], 10), 4)
        self.assertEqual(find([2, 4, 6, 8, 10], 2), 0)
    def test_single(self):
        self.assertEqual(find([17], 17), 0)
