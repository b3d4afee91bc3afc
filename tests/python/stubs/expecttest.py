"""A stand-in for expecttest (not packaged by Debian), which
torch.testing._internal imports: enough for its op database to load."""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, actual, expect, skip=0):
        self.assertEqual(actual, expect)
