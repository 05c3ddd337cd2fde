"""How a conversation becomes text: named templates, or the tokenizer's own chat template.

Each template turns a `Conversation` into (prompt text, response text) pairs, one per exchange;
the trainer learns only the response parts (unless train_on_prompt). Named templates are a
registry, as in LLaMA-Factory (`template: qwen3_nothink`); an unknown name is refused listing
the valid ones. With no `template` key the tokenizer's chat template is used when it has one,
else `empty`.

Pure Python apart from the tokenizer object passed in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from shared.train_spec import SUPPORTED_TEMPLATES
from worker.trainer.dataset_loading import Conversation

Exchange = tuple[str, str]  # (prompt side, response side)


@dataclass(frozen=True)
class PromptTemplate:
    """Format strings; {content} is the turn's text, {eos} the tokenizer's end-of-sequence token."""

    name: str
    user: str = "{content}"
    assistant: str = "{content}{eos}"
    system: str = "{content}"
    observation: str = "{content}"
    function: str = "{content}{eos}"
    prefix: str = ""
    default_system: str = ""
    tools_intro: str = "\n\nYou can call these tools:\n"

    def render(self, conversation: Conversation, eos: str) -> list[Exchange]:
        system = conversation.system or self.default_system
        if conversation.tools:
            system = (system + self.tools_intro + _compact_tools(conversation.tools)).lstrip()
        head = self.prefix + (self.system.format(content=system) if system else "")
        exchanges: list[Exchange] = []
        turns = conversation.turns
        for index in range(0, len(turns), 2):
            (prompt_role, prompt), (response_role, response) = turns[index], turns[index + 1]
            prompt_format = self.user if prompt_role == "user" else self.observation
            response_format = self.assistant if response_role == "assistant" else self.function
            prompt_text = prompt_format.format(content=prompt, eos=eos)
            if index == 0:
                prompt_text = head + prompt_text
            exchanges.append((prompt_text, response_format.format(content=response, eos=eos)))
        return exchanges


def _compact_tools(tools: str) -> str:
    try:
        return json.dumps(json.loads(tools), ensure_ascii=False)
    except json.JSONDecodeError:
        return tools


_CHATML_USER = "<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"
_CHATML_OBSERVATION = (
    "<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
)
_LLAMA3_ASSISTANT_HEADER = "<|start_header_id|>assistant<|end_header_id|>\n\n"

TEMPLATES: dict[str, PromptTemplate] = {
    "empty": PromptTemplate("empty"),
    "default": PromptTemplate(
        "default", user="Human: {content}\nAssistant: ", assistant="{content}{eos}\n", system="System: {content}\n",
        observation="Tool: {content}\nAssistant: ", function="{content}{eos}\n",
    ),
    "alpaca": PromptTemplate(
        "alpaca",
        user="### Instruction:\n{content}\n\n### Response:\n",
        assistant="{content}{eos}\n\n",
        system="{content}\n\n",
        observation="### Tool result:\n{content}\n\n### Response:\n",
        function="{content}{eos}\n\n",
        default_system=(
            "Below is an instruction that describes a task. Write a response that appropriately completes the request."
        ),
    ),
    "llama3": PromptTemplate(
        "llama3",
        prefix="<|begin_of_text|>",
        system="<|start_header_id|>system<|end_header_id|>\n\n{content}<|eot_id|>",
        user="<|start_header_id|>user<|end_header_id|>\n\n{content}<|eot_id|>" + _LLAMA3_ASSISTANT_HEADER,
        assistant="{content}<|eot_id|>",
        observation="<|start_header_id|>ipython<|end_header_id|>\n\n{content}<|eot_id|>" + _LLAMA3_ASSISTANT_HEADER,
        function="{content}<|eot_id|>",
    ),
    "qwen": PromptTemplate(
        "qwen",
        system="<|im_start|>system\n{content}<|im_end|>\n",
        user=_CHATML_USER,
        assistant="{content}<|im_end|>\n",
        observation=_CHATML_OBSERVATION,
        function="<tool_call>\n{content}\n</tool_call><|im_end|>\n",
        default_system="You are a helpful assistant.",
        tools_intro="\n\n# Tools\n\nYou may call one or more functions. Their signatures:\n",
    ),
    "qwen3": PromptTemplate(
        "qwen3",
        system="<|im_start|>system\n{content}<|im_end|>\n",
        user=_CHATML_USER,
        # Qwen3 marks a direct answer with an empty thinking block.
        assistant="<think>\n\n</think>\n\n{content}<|im_end|>\n",
        observation=_CHATML_OBSERVATION,
        function="<tool_call>\n{content}\n</tool_call><|im_end|>\n",
        tools_intro="\n\n# Tools\n\nYou may call one or more functions. Their signatures:\n",
    ),
    "qwen3_nothink": PromptTemplate(
        "qwen3_nothink",
        system="<|im_start|>system\n{content}<|im_end|>\n",
        user=_CHATML_USER,
        assistant="{content}<|im_end|>\n",
        observation=_CHATML_OBSERVATION,
        function="<tool_call>\n{content}\n</tool_call><|im_end|>\n",
        tools_intro="\n\n# Tools\n\nYou may call one or more functions. Their signatures:\n",
    ),
}
assert set(TEMPLATES) == set(SUPPORTED_TEMPLATES), "keep shared/train_spec.SUPPORTED_TEMPLATES in step"


class TemplateError(ValueError):
    pass


def get_template(name: str) -> PromptTemplate:
    try:
        return TEMPLATES[name]
    except KeyError:
        raise TemplateError(f"template {name!r} is unknown; supported: {', '.join(sorted(TEMPLATES))}") from None


class ChatTemplateRenderer:
    """Renders with the tokenizer's chat template. The response part of each exchange is what
    the full rendering adds after the prompt rendered with add_generation_prompt."""

    name = "tokenizer chat template"
    _ROLES = {"user": "user", "assistant": "assistant", "observation": "tool", "function": "assistant"}

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def _apply(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def render(self, conversation: Conversation, eos: str) -> list[Exchange]:  # noqa: ARG002 - template supplies eos
        messages = [{"role": "system", "content": conversation.system}] if conversation.system else []
        exchanges: list[Exchange] = []
        rendered_so_far = ""
        turns = conversation.turns
        for index in range(0, len(turns), 2):
            (prompt_role, prompt), (response_role, response) = turns[index], turns[index + 1]
            messages.append({"role": self._ROLES[prompt_role], "content": prompt})
            with_prompt = self._apply(messages, generation_prompt=True)
            messages.append({"role": self._ROLES[response_role], "content": response})
            with_response = self._apply(messages, generation_prompt=False)
            if not (with_prompt.startswith(rendered_so_far) and with_response.startswith(with_prompt)):
                raise TemplateError(
                    "the tokenizer's chat template does not render turn by turn (a later turn rewrites earlier "
                    f"text); set template to one of: {', '.join(sorted(TEMPLATES))}"
                )
            exchanges.append((with_prompt[len(rendered_so_far):], with_response[len(with_prompt):]))
            rendered_so_far = with_response
        return exchanges


def select_renderer(template_name: str | None, tokenizer):
    if template_name:
        return get_template(template_name)
    if getattr(tokenizer, "chat_template", None):
        return ChatTemplateRenderer(tokenizer)
    return TEMPLATES["empty"]
