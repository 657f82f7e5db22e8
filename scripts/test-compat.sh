#!/usr/bin/env bash
# The compatibility lane (make test-compat): for each Flower version given (default: the newest
# supported, 1.42.0, and the lowest, 1.41.0), a venv .venv-compat-<version> with clusterfed and
# that Flower, then the library, client-helper, example and install tests in it. clusterfed's own
# dependencies and the test tools come at constraints.txt's versions; Flower brings its own
# (each release pins some, e.g. uv), so a failure is Flower's doing.
#   COMPAT_TORCH     torch for the lane (default: the CPU build, small and enough for these tests)
#   COMPAT_PIP_ARGS  extra pip arguments, e.g. "--extra-index-url https://download.pytorch.org/whl/cpu"
#                    on a machine whose index does not hold the +cpu wheels
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
TORCH=${COMPAT_TORCH:-torch==2.13.0+cpu torchvision==0.28.0}
read -r -a PIP_ARGS <<< "${COMPAT_PIP_ARGS:-}"
TESTS=(tests/test_library.py tests/test_client_helper.py tests/test_examples.py
       tests/test_lean_install.py tests/test_flower_datasets.py)
VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(1.42.0 1.41.0)
# constraints.txt's lines for clusterfed's direct dependencies and the test tools
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
grep -iE '^(numpy|scipy|scikit-learn|pydantic|flwr-datasets|datasets|pytest|pyyaml)==' constraints.txt > "$pins"
status=0
for version in "${VERSIONS[@]}"; do
    venv=.venv-compat-$version
    echo "== Flower $version ($venv)"
    test -x "$venv/bin/python" || "$PYTHON" -m venv "$venv"
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install -q "${PIP_ARGS[@]}" -c "$pins" $TORCH "flwr[simulation]==$version" \
        -e ".[torch,simulation,datasets]" pytest PyYAML
    "$venv/bin/python" -c "import flwr, importlib.metadata as m; v = m.version('flwr'); \
assert v == '$version', v; print('flwr', v, '| torch', m.version('torch'))"
    if "$venv/bin/python" -m pytest -q -p no:cacheprovider "${TESTS[@]}"; then
        echo "== Flower $version: passed"
    else
        echo "== Flower $version: FAILED"; status=1
    fi
done
exit $status
