"""The conformance scenarios (conformance/README.md), run against this package through its
driver: the same decisions as the Rust client's, shown on the same fleets."""

import subprocess
import sys

import pytest

from conftest import conformance_binary


@pytest.mark.parametrize("flavour", ["", "--asyncio"], ids=["sync", "asyncio"])
def test_the_package_passes_every_conformance_scenario(flavour: str) -> None:
    driver = f"{sys.executable} -m shard_directory.conformance {flavour}".strip()
    done = subprocess.run(
        [conformance_binary(), "--driver", driver],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert len([l for l in lines if l.startswith("ok ")]) == 10, done.stdout
