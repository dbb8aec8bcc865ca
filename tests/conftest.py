"""Shared fixtures: small stores written once per session."""
import pytest

from hybrid.data.synthetic import synthesize


@pytest.fixture(scope="session")
def criteo_like(tmp_path_factory):
    """A 60k-sample Criteo-like synthetic store (in file order)."""
    path = tmp_path_factory.mktemp("stores") / "criteo-like"
    synthesize(path, like="criteo-kaggle", rows=60_000, scale=0.001, seed=7)
    return path
