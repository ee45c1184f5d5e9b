"""The CLI's tests run its commands in this process too: none of them turns on
the persistent compilation cache for the rest of the session."""

import pytest


@pytest.fixture(autouse=True)
def _no_compile_cache(no_compile_cache):
    pass
