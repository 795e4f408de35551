"""Chat templates of the project's own, written in the shapes open models use for tools (no downloads).

- ``HERMES``: the Qwen2.5 / Qwen3 / Hermes shape: the tools' JSON schemas in the system turn between
  ``<tools>`` tags, calls as ``<tool_call>{json}</tool_call>``, results as ``<tool_response>`` in a user turn.
- ``LLAMA3``: the Llama 3.1 JSON shape: the schemas in the first user turn, calls as a bare JSON object
  ``{"name", "parameters"}``, results in an ``ipython`` turn.
"""

HERMES = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- 'Tools you can call, one JSON schema a line:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    '{{- \'\\n</tools>\\nCall one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.<|im_end|>\\n\' }}'
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls or [] %}"
    '{{- \'<tool_call>\\n{"name": "\' + call.function.name + \'", "arguments": \' }}'
    "{%- if call.function.arguments is string %}{{- call.function.arguments }}"
    "{%- else %}{{- call.function.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA3 = (
    "{%- for message in messages %}"
    "{%- if message.role == 'user' and loop.first and tools %}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\nAnswer with a function call as JSON: '"
    ' + \'{"name": function name, "parameters": arguments}. Functions:\\n\' }}'
    "{%- for tool in tools %}{{- (tool | tojson) + '\\n' }}{%- endfor %}"
    "{{- message.content + '<|eot_id|>' }}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{%- for call in message.tool_calls %}"
    '{{- \'<|start_header_id|>assistant<|end_header_id|>\\n\\n{"name": "\' + call.function.name'
    " + '\", \"parameters\": ' + call.function.arguments + '}<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
