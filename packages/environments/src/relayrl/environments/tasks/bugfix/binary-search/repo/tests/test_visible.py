import unittest

from search.bisect_search import find


class TestFind(unittest.TestCase):
    def test_absent(self):
        self.assertEqual(find([1, 3, 5], 4), -1)
