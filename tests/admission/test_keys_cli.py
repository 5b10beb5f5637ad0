"""``inferlb keys create|list|revoke`` on a SQLite database."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferlb.admission.keys import hash_key
from inferlb.admission.store import get_key
from inferlb.cli.main import main
from inferlb.store.db import make_engine


def test_create_list_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    assert main(["keys", "create", "--tenant", "acme", "--models", "m,emb", "--rpm", "60", "--tpm", "1000",
                 "--priority-ceiling", "interactive", "--budget", "5", "--json", "--database-url", url]) == 0
    created = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    secret = created["key"]
    assert secret.startswith("sk-gw-") and created["models"] == ["m", "emb"] and created["rpm"] == 60
    engine = make_engine(url)
    try:
        assert get_key(engine, created["id"]).key_hash == hash_key(secret)
    finally:
        engine.dispose()

    assert main(["keys", "list", "--json", "--database-url", url]) == 0
    listed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [k["id"] for k in listed] == [created["id"]] and secret not in json.dumps(listed)
    assert main(["keys", "list", "--database-url", url]) == 0
    assert "active" in capsys.readouterr().out

    assert main(["keys", "revoke", created["id"], "--database-url", url]) == 0
    assert "revoked" in capsys.readouterr().out
    assert main(["keys", "list", "--active", "--json", "--database-url", url]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == []
    assert main(["keys", "revoke", "key_nope", "--database-url", url]) == 1
    with pytest.raises(SystemExit):
        main(["keys", "create", "--tenant", "t", "--rpm", "0", "--database-url", url])
