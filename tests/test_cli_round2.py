"""`hearth` command-line defects found by a first try (issue 14), each run as a user would run it."""
import json
import os
import subprocess
import sys

from app.store import ChatStore


def hearth(*args, env=None, input=None):
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, env=env,
                          input=input, timeout=300)


def test_an_empty_prompt_is_refused_before_any_load(tmp_path):
    # the model path does not exist: were it loaded first, the error would be about the path
    for extra in ((), ("--chat",)):
        proc = hearth("generate", str(tmp_path / "no-such-model"), "--prompt", "  ", *extra)
        assert proc.returncode != 0 and "the prompt is empty" in proc.stderr
        assert "Nothing exists" not in proc.stderr and "Traceback" not in proc.stderr


def test_inspect_json_into_a_closed_pipe_ends_quietly(synth):
    cmd = f"{sys.executable} -m engine inspect {synth('smollm2-135m')} --json | head -1"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip() == "{"
    assert "BrokenPipeError" not in proc.stderr and "Traceback" not in proc.stderr


def test_inspect_prints_dtypes_in_words(synth):
    out = hearth("inspect", str(synth("tiny"))).stdout
    line = next(l for l in out.splitlines() if "dtypes" in l)
    assert "{" not in line and "bf16 × " in line.lower()


def test_help_lists_the_app_and_generate_has_context():
    assert "app" in hearth("--help").stdout.split("{", 1)[1].split("}", 1)[0].split(",")
    assert "--context" in hearth("generate", "--help").stdout and "--context" in hearth("chat", "--help").stdout


def test_generate_says_when_max_tokens_cut_the_reply_and_honours_context(synth, tmp_path):
    env = dict(os.environ, HEARTH_HOME=str(tmp_path / "home"))
    proc = hearth("generate", str(synth("tiny", tokenizer=True)), "--prompt", "the", "--max-tokens", "3",
                  "--temperature", "0", "--backend", "torch", "--context", "64", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "cut at --max-tokens 3" in proc.stderr
    long_prompt = "the " * 200
    proc = hearth("generate", str(synth("tiny", tokenizer=True)), "--prompt", long_prompt, "--backend", "torch",
                  "--context", "64", env=env)
    assert proc.returncode == 1 and "context of 64" in proc.stderr


def test_models_import_refuses_an_unknown_architecture(synth, tmp_path):
    import shutil

    folder = tmp_path / "gpt2ish"
    shutil.copytree(synth("tiny", tokenizer=True), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(cfg))
    env = dict(os.environ, HEARTH_HOME=str(tmp_path / "home"))
    proc = hearth("models", "import", str(folder), env=env)
    assert proc.returncode == 1 and "GPT2LMHeadModel is not supported" in proc.stderr
    assert "It was not added to the library" in proc.stderr
    assert json.loads(hearth("models", "list", "--json", env=env).stdout) == []


def test_chat_ignores_empty_lines_and_saves_the_conversation(synth, tmp_path):
    home = tmp_path / "home"
    env = dict(os.environ, HEARTH_HOME=str(home))
    proc = hearth("chat", str(synth("tiny", tokenizer=True)), "--backend", "torch", "--max-tokens", "4",
                  "--temperature", "0", env=env, input="hello\n\n\nagain\n/quit\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("assistant>") == 2          # the empty lines did not end the session
    assert "Saved as the chat" in proc.stderr
    store = ChatStore(home / "chats.sqlite3")
    chats = store.list_chats()
    assert len(chats) == 1 and chats[0].title == "hello"
    msgs = store.messages(chats[0].id)
    assert [m.role for m in msgs] == ["user", "assistant"] * 2 and msgs[2].content == "again"
    assert msgs[1].stats["generated_tokens"] <= 4 and msgs[1].seed is not None
    store.close()
