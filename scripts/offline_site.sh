# Sourced, from the repository root, by the scripts that run on a GPU node without network access: installs the
# wheels that scripts/prepare_device.sh staged in .whl/ into /tmp/site once a machine (a warm machine keeps them)
# and puts /tmp/site, where there is one, and the checkout on PYTHONPATH.
if [ ! -d /tmp/site ] && ls .whl/*.whl >/dev/null 2>&1; then
  ${PYTHON:-python3} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$([ -d /tmp/site ] && echo /tmp/site:)$PWD
