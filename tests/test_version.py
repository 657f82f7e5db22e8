"""``clusterfed.__version__``: the installed distribution's version, as packages report theirs."""

from importlib.metadata import version

from packaging.version import Version

import clusterfed


def test_version_is_the_installed_distributions_and_a_valid_version():
    assert clusterfed.__version__ == version("clusterfed")
    assert Version(clusterfed.__version__) >= Version("0.1")
    assert "__version__" in dir(clusterfed)
    assert "version" not in dir(clusterfed)  # the helper it is read with is not a public name
