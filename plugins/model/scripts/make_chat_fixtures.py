"""Chat-template fixtures: conversations rendered by transformers' `apply_chat_template`.

The templates are written here in the styles models ship (ChatML with a default system
message, as Qwen's; Llama 3's headers with `bos_token` and `| trim`; one using `namespace`,
`loop` variables, `tojson` and Python string methods; two that take `tools`, rendered with
`tojson`, and `tool` messages). Each is saved with a tokenizer as
transformers saves one (`tokenizer_config.json`, and `chat_template.jinja` where this version
writes it), and every conversation is rendered with and without the generation prompt:

    plugins/model/scripts/setup-transformers.sh --no-torch
    .cache/transformers-light/bin/python plugins/model/scripts/make_chat_fixtures.py

Writes plugins/model/tests/fixtures/chat/<template>/ and expected.json.
"""

import json
import os
import sys

import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "chat")

TEMPLATES = {
    "chatml": (
        "{%- if messages[0]['role'] == 'system' %}\n"
        "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
        "{%- else %}\n"
        "    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n"
        "{%- endif %}\n"
        "{%- for message in messages %}\n"
        "    {%- if message.role == 'system' and loop.first %}\n"
        "        {%- continue %}\n"
        "    {%- endif %}\n"
        "    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "    {{- '<|im_start|>assistant\\n' }}\n"
        "{%- endif %}\n"
    ),
    "llama3": (
        "{{- bos_token }}\n"
        "{%- for message in messages %}\n"
        "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
        "{%- endif %}\n"
    ),
    "thinking": (
        "{%- set ns = namespace(last_user=-1) %}\n"
        "{%- for message in messages %}\n"
        "    {%- if message.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}\n"
        "{%- endfor %}\n"
        "{%- for message in messages %}\n"
        "    {%- set content = message.content %}\n"
        "    {%- if message.role == 'assistant' and '</think>' in content %}\n"
        "        {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
        "    {%- endif %}\n"
        "    {%- if message.role not in ['system', 'user', 'assistant'] %}\n"
        "        {{- raise_exception('unknown role ' + message.role) }}\n"
        "    {%- endif %}\n"
        "{{ loop.index }}. {{ message.role | upper }}{% if loop.index0 == ns.last_user %} (last){% endif %}: {{ content.strip() }}\n"
        "    {% if message.role == 'system' %}\n"
        "[system rules apply]\n"
        "    {% endif %}\n"
        "{%- if not loop.last %}\n"
        "\n"
        "{% endif %}\n"
        "{%- endfor %}\n"
        "{{- '\\nmeta: ' + {'turns': messages | length, 'first': messages[0].role, 'ok': true} | tojson }}\n"
        "{%- if add_generation_prompt %}\n"
        "{{ eos_token }}<think>\n"
        "{% endif %}\n"
    ),
}

# Templates that take `tools` and `tool` messages: in ChatML with the schemas in the system
# turn and the answers in a user turn (as Qwen2.5's and Hermes' do), and with Llama 3's headers
# (the schemas indented, the answers as `ipython` messages).
TOOL_TEMPLATES = {
    "chatml-tools": (
        "{%- if tools %}\n"
        "    {{- '<|im_start|>system\\n' }}\n"
        "    {%- if messages[0].role == 'system' %}\n"
        "        {{- messages[0].content + '\\n\\n' }}\n"
        "    {%- endif %}\n"
        "    {{- '# Tools\\n\\nThese functions can be called. Their signatures:\\n<tools>' }}\n"
        "    {%- for tool in tools %}\n"
        "        {{- '\\n' + tool | tojson }}\n"
        "    {%- endfor %}\n"
        "    {{- '\\n</tools>\\n\\nCall one as <tool_call>\\n{\"name\": ..., \"arguments\": {...}}\\n</tool_call><|im_end|>\\n' }}\n"
        "{%- elif messages[0].role == 'system' %}\n"
        "    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
        "{%- endif %}\n"
        "{%- for message in messages %}\n"
        "    {%- if message.role == 'system' and loop.first %}\n"
        "        {%- continue %}\n"
        "    {%- endif %}\n"
        "    {%- if message.role == 'tool' %}\n"
        "        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}\n"
        "            {{- '<|im_start|>user' }}\n"
        "        {%- endif %}\n"
        "        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}\n"
        "        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}\n"
        "            {{- '<|im_end|>\\n' }}\n"
        "        {%- endif %}\n"
        "    {%- else %}\n"
        "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "    {{- '<|im_start|>assistant\\n' }}\n"
        "{%- endif %}\n"
    ),
    # the assistant's calls written from `tool_calls` (as Qwen2.5's template writes them: an
    # object's `arguments` through `tojson`, a string's as it is), the answers by `name`
    "qwen-tool-calls": (
        "{%- if tools %}\n"
        "    {{- '<|im_start|>system\\n<tools>' }}\n"
        "    {%- for tool in tools %}\n"
        "        {{- '\\n' + tool | tojson }}\n"
        "    {%- endfor %}\n"
        "    {{- '\\n</tools><|im_end|>\\n' }}\n"
        "{%- endif %}\n"
        "{%- for message in messages %}\n"
        "    {%- if message.role == 'assistant' %}\n"
        "        {{- '<|im_start|>assistant' }}\n"
        "        {%- if message.content %}\n"
        "            {{- '\\n' + message.content }}\n"
        "        {%- endif %}\n"
        "        {%- for call in message.tool_calls %}\n"
        "            {%- if call.function is defined %}{% set call = call.function %}{% endif %}\n"
        "            {{- '\\n<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' }}\n"
        "            {%- if call.arguments is string %}\n"
        "                {{- call.arguments }}\n"
        "            {%- else %}\n"
        "                {{- call.arguments | tojson }}\n"
        "            {%- endif %}\n"
        "            {{- '}\\n</tool_call>' }}\n"
        "        {%- endfor %}\n"
        "        {{- '<|im_end|>\\n' }}\n"
        "    {%- elif message.role == 'tool' %}\n"
        "        {{- '<|im_start|>user\\n<tool_response name=\"' + (message.name or '') + '\" id=\"' + (message.tool_call_id or '') + '\">\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}\n"
        "    {%- else %}\n"
        "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "    {{- '<|im_start|>assistant\\n' }}\n"
        "{%- endif %}\n"
    ),
    "llama3-tools": (
        "{{- bos_token + '<|start_header_id|>system<|end_header_id|>\\n\\n' }}\n"
        "{%- if tools %}\n"
        "    {{- 'Call a function by answering {\"name\": its name, \"parameters\": its arguments}.\\n\\n' }}\n"
        "    {%- for t in tools %}\n"
        "        {{- t | tojson(indent=4) + '\\n\\n' }}\n"
        "    {%- endfor %}\n"
        "{%- endif %}\n"
        "{%- if messages[0].role == 'system' %}\n"
        "    {{- messages[0].content | trim }}\n"
        "{%- endif %}\n"
        "{{- '<|eot_id|>' }}\n"
        "{%- for message in messages %}\n"
        "    {%- if message.role == 'system' %}\n"
        "        {%- continue %}\n"
        "    {%- endif %}\n"
        "    {%- if message.role == 'tool' %}\n"
        "        {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}\n"
        "    {%- else %}\n"
        "        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
        "{%- endif %}\n"
    ),
}

# Tools as a program declares them: keys in the order written (not sorted), nested schemas,
# a float default, text that JSON escapes.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code; variables persist between calls.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The code."}},
                "required": ["code"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Look up \"exact\" words <in> a corpus & rank them \u00e9",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1, "default": 5},
                    "weight": {"type": "number", "default": 2.0},
                    "filters": {
                        "type": "object",
                        "properties": {"year": {"type": "integer"}, "lang": {"enum": ["en", "fr"]}},
                    },
                },
                "required": ["query", "limit"],
            },
        },
    },
]

TOOL_CONVERSATIONS = [
    [{"role": "user", "content": "What is 37 * 48?"}],
    [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "Compute 2**10 and search for it."},
        {
            "role": "assistant",
            "content": '<tool_call>\n{"name": "python", "arguments": {"code": "print(2**10)"}}\n</tool_call>',
        },
        {"role": "tool", "content": "1024\n"},
        {"role": "tool", "content": "[\"1024 is 2^10\"]"},
        {"role": "assistant", "content": "It is 1024."},
        {"role": "user", "content": "Thanks"},
    ],
]

# An agent's history as OpenAI clients send it: calls as structured `tool_calls` (arguments
# an object, and a JSON string as the API gives them), answers naming their call.
TOOL_CONVERSATIONS.append(
    [
        {"role": "user", "content": "Compute 2**10, then search for it."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "python", "arguments": {"code": "print(2**10)", "z": [1, 2.0]}},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "search", "arguments": "{\"query\":\"1024\",\"limit\":3}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "name": "python", "content": "1024"},
        {"role": "tool", "tool_call_id": "call_2", "name": "search", "content": "[]"},
        {"role": "assistant", "content": "Thinking done.", "tool_calls": [
            {"type": "function", "function": {"name": "python", "arguments": {}}}
        ]},
    ]
)

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+3?"}],
    [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\nParis"},
        {"role": "user", "content": "  And of Italy? \u00e9\u00e0 \"quoted\" <tag> & more  "},
    ],
    [
        {"role": "user", "content": "Line one\nLine two\n"},
        {"role": "assistant", "content": "\n  Indented reply\n"},
    ],
]


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(
        tokenizer_object=inner, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def saved(name: str, template: str) -> PreTrainedTokenizerFast:
    """A tokenizer with `template`, saved as transformers saves one in OUT/name."""
    tok = tokenizer()
    tok.chat_template = template
    folder = os.path.join(OUT, name)
    os.makedirs(folder, exist_ok=True)
    tok.save_pretrained(folder)
    # the vocabulary is not what is tested: keep the folder small
    for extra in ("tokenizer.json", "special_tokens_map.json"):
        path = os.path.join(folder, extra)
        if os.path.exists(path):
            os.remove(path)
    return tok


def main() -> int:
    cases = []
    for name, template in TEMPLATES.items():
        tok = saved(name, template)
        for messages in CONVERSATIONS:
            for generation_prompt in (False, True):
                text = tok.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=generation_prompt
                )
                cases.append(
                    {
                        "template": name,
                        "messages": messages,
                        "add_generation_prompt": generation_prompt,
                        "expected": text,
                    }
                )
    for name, template in TOOL_TEMPLATES.items():
        tok = saved(name, template)
        for messages in TOOL_CONVERSATIONS:
            for tools in (TOOLS, None):
                for generation_prompt in (False, True):
                    text = tok.apply_chat_template(
                        messages,
                        tools=tools,
                        tokenize=False,
                        add_generation_prompt=generation_prompt,
                    )
                    cases.append(
                        {
                            "template": name,
                            "messages": messages,
                            "tools": tools,
                            "add_generation_prompt": generation_prompt,
                            "expected": text,
                        }
                    )
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(
            {"made_with": {"transformers": transformers.__version__}, "cases": cases},
            f,
            ensure_ascii=False,
            indent=1,
        )
        f.write("\n")
    print(f"{len(cases)} renderings of {len(TEMPLATES) + len(TOOL_TEMPLATES)} templates -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
