"""Unit tests, run in plain CPython by `./build.sh test`."""

import unittest
from array import array  # noqa: F401  (for tests like the one below)

import sluice_plugin

import app


class PluginTest(unittest.TestCase):
    def test_describes_itself(self):
        info = app.WitWorld().describe()
        self.assertEqual(info.name, app.Plugin.name)
        self.assertEqual([s.name for s in info.outputs], [s.name for s in app.Plugin.outputs])

    def test_runs_its_sample(self):
        # Its sample, or zeros shaped from its inputs; the outputs are
        # checked against the declared ones (names, dtypes, shapes, lengths).
        outputs = sluice_plugin.check(app.Plugin)
        self.assertEqual([t.name for t in outputs], [s.name for s in app.Plugin.outputs])

    # Add tests of your transform, e.g.:
    # def test_doubles(self):
    #     x = sluice_plugin.tensor("x", [1, 2], array("f", [1.0, 2.5]))
    #     (out,) = sluice_plugin.check(app.Plugin, [x])
    #     self.assertEqual(list(sluice_plugin.TensorView(out).f32()), [2.0, 5.0])


if __name__ == "__main__":
    unittest.main()
