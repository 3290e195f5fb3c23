"""The built-in multi-turn job's agent, written as a user writes one: OpenAI's Python client,
a `python` tool it runs itself, tool calls in a loop. `areal train` trains the policy behind it
through the agent proxy (plugins/tools/examples/tool-mul-agent.toml).

Two ways to run it, both as AReaL's proxy offers them:

- one episode per process (`[episode] command = [...]`): the task item arrives on standard
  input, OPENAI_BASE_URL and OPENAI_API_KEY name the proxy and this episode's session;
- a service (`[episode] service = [...]`, or started by hand against a proxy): WORKERS threads
  each take sessions with POST /rl/start_session (the admin key in AREAL_PROXY_KEY), run the
  episode of the item that comes with it, and end it; a 429 means the run admits no more for
  now, and the client waits as Retry-After says.

No reward is set: the run's [reward] grades the last answer. Needs `openai` (installed by
core/serve/scripts/setup-openai.sh into .cache/openai).
"""

import ast
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code; the value of its last line is shown.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
]

# The tool runs the code in a fresh interpreter: what it prints, then the value of its last
# line when that is an expression (as a notebook shows it), then the error it raised.
RUNNER = r"""
import ast, sys
tree = ast.parse(sys.stdin.read())
last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
scope = {}
exec(compile(tree, "<tool>", "exec"), scope)
if last is not None:
    value = eval(compile(ast.Expression(last.value), "<tool>", "eval"), scope)
    if value is not None:
        print(repr(value))
"""


def run_python(code):
    try:
        done = subprocess.run(
            [sys.executable, "-c", RUNNER],
            input=code,
            capture_output=True,
            text=True,
            timeout=1.0,
        )
    except subprocess.TimeoutExpired:
        return "the code ran past its limit of 1 s\n"
    output = done.stdout
    if done.returncode != 0:
        output += done.stderr.strip().splitlines()[-1] + "\n" if done.stderr.strip() else ""
    return output[:256]


def episode(client, item, max_turns=2):
    """The policy answers `item`, calling the tool as it likes; at most `max_turns` turns."""
    messages = [{"role": "user", "content": item["prompt"]}]
    for turn in range(max_turns):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls or turn + 1 == max_turns:
            return message.content
        for call in message.tool_calls:
            try:
                code = json.loads(call.function.arguments)["code"]
                output = run_python(code)
            except (KeyError, ValueError) as e:
                output = f"bad call: {e}\n"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return None


def post(url, key, body):
    """POST `body` to one of the proxy's /rl routes with `key`: the status and the answer."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as answer:
            return answer.status, json.load(answer), answer.headers
    except urllib.error.HTTPError as e:
        return e.code, None, e.headers


def serve(workers):
    proxy = os.environ["AREAL_PROXY_URL"].rstrip("/")
    admin = os.environ.get("AREAL_PROXY_KEY", "")
    # one client, its connection pool shared; each session's key set per session
    base = OpenAI(base_url=proxy + "/v1", api_key="none", max_retries=0)

    def worker():
        while True:
            status, session, headers = post(proxy + "/rl/start_session", admin, {"task_id": "tool-mul"})
            if status == 429:
                time.sleep(float(headers.get("Retry-After", "1")) / 10)
                continue
            if status != 200:
                raise SystemExit(f"start_session answered {status}")
            episode(base.with_options(api_key=session["api_key"]), session["item"])
            post(proxy + "/rl/end_session", session["api_key"], {})

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    if os.environ.get("AREAL_SESSION_ID"):
        # one episode: the item on standard input, the session in OPENAI_API_KEY
        episode(OpenAI(), json.load(sys.stdin))
    else:
        serve(int(os.environ.get("WORKERS", "16")))
