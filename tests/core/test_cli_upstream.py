"""Upstream's other CLI subcommands: collect-env, list-modules and module-status answer with
this package's kernels; the ones about compiled artifacts exit 2 with one line saying why."""

import json

import pytest

from flashinfer import cli, cli_upstream


def test_collect_env(capsys):
    assert cli.main(["collect-env", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["flashinfer"]["api"] == "0.6.18" and "vllm" in data["packages"]
    assert cli.main(["collect-env"]) == 0
    assert "upstream API" in capsys.readouterr().out


def test_list_modules_and_status(capsys):
    assert cli.main(["list-modules", "triton:two_pass"]) == 0
    out = capsys.readouterr().out
    assert "sampling_from_probs" in out and "kernel: triton.sampling:" in out
    assert cli.main(["list-modules", "nope"]) == 2
    assert "no kernel named 'nope'" in capsys.readouterr().err
    assert cli.main(["module-status", "--detailed", "--filter", "planned"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(line.endswith("planned") for line in lines[:-1]) and "total" in lines[-1]
    assert cli.main(["module-status", "--filter", "not-compiled"]) == 0  # upstream's spelling


@pytest.mark.parametrize("name", sorted(cli_upstream.NO_COUNTERPART))
def test_artifact_commands_say_why_in_one_line(name, capsys):
    assert cli.main([name, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"flashinfer {name}: ") and "\n" not in err
