#!/usr/bin/env bash
# The compatibility lane (make test-compat): for each Flower version given (default: the newest
# supported, 1.42.0, the lowest, 1.41.0, and nightly), a venv .venv-compat-<version> with clusterfed and
# that Flower, then the library, client-helper, example and install tests in it. clusterfed's own
# dependencies and the test tools come at constraints.txt's versions; Flower brings its own
# (each release pins some, e.g. uv), so a failure is Flower's doing.
# The word nightly is the same tests on Flower's next release: the newest flwr-nightly on the index
# (resolved when the lane runs; it installs the flwr module) in .venv-compat-nightly, clusterfed installed
# beside it without its flwr requirement. That lane may fail without failing the run, but says
# so: "== flwr-nightly <version>: FAILED (allowed)", the failing tests, and the summary line.
#   COMPAT_TORCH     torch for the lane (default: the CPU build, small and enough for these tests)
#   COMPAT_PIP_ARGS  extra pip arguments, e.g. "--extra-index-url https://download.pytorch.org/whl/cpu"
#                    on a machine whose index does not hold the +cpu wheels
#   COMPAT_NIGHTLY   0 skips the flwr-nightly lane even where nightly is given
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
TORCH=${COMPAT_TORCH:-torch==2.13.0+cpu torchvision==0.28.0}
NIGHTLY=${COMPAT_NIGHTLY:-1}
read -r -a PIP_ARGS <<< "${COMPAT_PIP_ARGS:-}"
TESTS=(tests/test_library.py tests/test_client_helper.py tests/test_examples.py
       tests/test_lean_install.py tests/test_flower_datasets.py)
VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(1.42.0 1.41.0 nightly)
# constraints.txt's lines for clusterfed's direct dependencies and the test tools
pins=$(mktemp)
log=$(mktemp)
trap 'rm -f "$pins" "$log"' EXIT
grep -iE '^(numpy|scipy|scikit-learn|pydantic|flwr-datasets|datasets|pytest|pyyaml)==' constraints.txt > "$pins"
status=0
summary=()

# run_tests VENV: the tests in VENV; the failing ones' names are in $log's short summary
run_tests() {
    "$1/bin/python" -m pytest -rfE -p no:cacheprovider "${TESTS[@]}" 2>&1 | tee "$log"
    return "${PIPESTATUS[0]}"
}

for version in "${VERSIONS[@]}"; do
    [ "$version" != nightly ] || continue
    venv=.venv-compat-$version
    echo "== Flower $version ($venv)"
    test -x "$venv/bin/python" || "$PYTHON" -m venv "$venv"
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install -q "${PIP_ARGS[@]}" -c "$pins" $TORCH "flwr[simulation]==$version" \
        -e ".[torch,simulation,datasets]" pytest PyYAML
    "$venv/bin/python" -c "import flwr, importlib.metadata as m; v = m.version('flwr'); \
assert v == '$version', v; print('flwr', v, '| torch', m.version('torch'))"
    if run_tests "$venv"; then
        echo "== Flower $version: passed"; summary+=("Flower $version passed")
    else
        echo "== Flower $version: FAILED"; summary+=("Flower $version FAILED"); status=1
    fi
done

# nightly_lane: Flower's next release; every failure here is reported and allowed
nightly_lane() {
    local venv=.venv-compat-nightly version reqs
    test -x "$venv/bin/python" || "$PYTHON" -m venv "$venv" || { echo "cannot create $venv"; return 1; }
    version=$("$venv/bin/python" -m pip index versions --pre "${PIP_ARGS[@]}" flwr-nightly 2>/dev/null \
              | sed -n 's/^flwr-nightly (\(.*\))$/\1/p' | head -n 1) || true
    NIGHTLY_VERSION=${version:-unresolved}
    echo "== flwr-nightly $NIGHTLY_VERSION ($venv)"
    [ -n "$version" ] || { echo "no flwr-nightly version on the index"; return 1; }
    # clusterfed's requirements and those of its torch and datasets extras, less flwr (the
    # nightly distribution provides the flwr module under another name)
    reqs=$("$venv/bin/python" -c "import re, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(r for r in p['dependencies'] + p['optional-dependencies']['torch'] \
+ p['optional-dependencies']['datasets'] if not re.match(r'flwr\b(?!-)', r)))") || return 1
    local args=()
    mapfile -t args <<< "$reqs"
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install -q "${PIP_ARGS[@]}" -c "$pins" $TORCH "flwr-nightly[simulation]==$version" \
        "${args[@]}" pytest PyYAML || { echo "pip could not install flwr-nightly $version"; return 1; }
    "$venv/bin/python" -m pip install -q --no-deps -e . || return 1
    "$venv/bin/python" -c "import flwr, importlib.metadata as m; v = m.version('flwr-nightly'); \
assert v == '$version', v; print('flwr-nightly', v, '| torch', m.version('torch'))" || return 1
    run_tests "$venv"
}

if [[ " ${VERSIONS[*]} " != *" nightly "* ]]; then
    :
elif [ "$NIGHTLY" != 0 ]; then
    NIGHTLY_VERSION=unresolved
    : > "$log"
    if nightly_lane; then
        echo "== flwr-nightly $NIGHTLY_VERSION: passed"; summary+=("flwr-nightly $NIGHTLY_VERSION passed")
    else
        failed=$(grep -E '^(FAILED|ERROR) ' "$log" | sed -E 's/ - .*//' || true)
        echo "== flwr-nightly $NIGHTLY_VERSION: FAILED (allowed)"
        if [ -n "$failed" ]; then
            echo "$failed" | sed 's/^/   /'
            summary+=("flwr-nightly $NIGHTLY_VERSION FAILED (allowed: $(echo "$failed" | wc -l) failing)")
        else
            echo "   (no test failed: the lane stopped before or outside the tests, see above)"
            summary+=("flwr-nightly $NIGHTLY_VERSION FAILED (allowed: before the tests)")
        fi
    fi
else
    summary+=("flwr-nightly skipped (COMPAT_NIGHTLY=0)")
fi

echo "== compat summary: $(IFS=';'; echo "${summary[*]}" | sed 's/;/; /g')"
exit $status
