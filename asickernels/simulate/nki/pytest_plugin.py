"""``pytest -p asickernels.simulate.nki.pytest_plugin``: installs the import hook
(:func:`asickernels.simulate.nki.install.install`) before pytest imports any conftest, so a
test suite written for the Neuron SDK or AWS's CPU simulator (``nki``, ``neuronxcc.nki``,
``nki_cpu_simulator``, ``neuron_dtypes``) runs unchanged where they are not installed;
pytest-xdist workers load it too. A real installed package is never shadowed."""

from asickernels.simulate.nki.install import install

install()
