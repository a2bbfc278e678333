"""Hostile programs sent to the running service: each scores 0 and the service answers the next request.
(tests/reward/test_sandbox.py checks in depth that each is contained; this checks the service survives.)"""

import os
import socket
import uuid

import pytest

SECRET = f"zb-secret-{uuid.uuid4().hex}"
OUTSIDE = f"/var/tmp/zb-escape-{uuid.uuid4().hex}"

# name -> (program, what it prints only if it escaped). The expected output of each test case is that
# escape mark, so a program that got out would pass its test and score above 0.
HOSTILE = {
    # Bounded (200 children that exit after 20 s) so that a broken sandbox cannot take the machine down.
    "fork bomb": ("import os, time\nn = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
                  "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(20)\n        os._exit(0)\n"
                  "    n += 1\nprint(n)", "200"),
    "endless loop": ("while True:\n    pass\nprint(SECRET)", SECRET),
    # Bounded at 4 GB so that a missing memory limit cannot exhaust the machine.
    "memory hog": ("hog = [bytearray(10**8) for _ in range(40)]\nprint(SECRET)", SECRET),
    # /tmp inside the sandbox is a private tmpfs; /var/tmp is the host's, world-writable.
    "write outside": (f"open({OUTSIDE!r}, 'w').write('x')\nprint(SECRET)", SECRET),
    "service environment": ("import os\nfound = os.environ.get('ZB_HOSTILE_SECRET', '')\ntry:\n"
                            "    found += open(f'/proc/{os.getppid()}/environ').read()\nexcept OSError:\n    pass\n"
                            "print(SECRET if SECRET in found else '')", SECRET),
    "file the service can read": ("print(open(SECRET_FILE).read())", SECRET),
    "kill parent": ("import os\ntry:\n    os.kill(os.getppid(), 9)\n    print(SECRET)\nexcept OSError:\n    pass",
                    SECRET),
    "gigabyte": ("import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n"
                 "print(SECRET)", SECRET),
    "loopback socket": ("import socket\ns = socket.create_connection(('127.0.0.1', PORT), timeout=2)\n"
                        "s.sendall(b'hi')\nprint(SECRET)", SECRET),
}


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("secret")
    path = folder / "secret.txt"
    path.write_text(SECRET)
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_scores_zero_and_service_goes_on(name, reward, secret_file, monkeypatch):
    monkeypatch.setenv("ZB_HOSTILE_SECRET", SECRET)
    program, escape_mark = HOSTILE[name]
    with socket.create_server(("127.0.0.1", 0)) as listener:
        source = (program.replace("SECRET_FILE", repr(str(secret_file)))
                  .replace("PORT", str(listener.getsockname()[1])).replace("SECRET", repr(SECRET)))
        tests = {"inputs": [""], "outputs": [escape_mark]}
        result = reward.score("code", f"```python\n{source}\n```", test_cases=tests, timeout=60)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert result.reward == 0.0 and not result.answer_ok, result
    assert not os.path.exists(OUTSIDE)
    assert reward.score("boxed", "\\boxed{7}", "7").answer_ok
    assert reward.score("code", "```python\nprint(int(input()) + 1)\n```",
                        test_cases={"inputs": ["1\n"], "outputs": ["2\n"]}).answer_ok
