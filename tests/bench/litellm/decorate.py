"""`cargo xtask bench`: the LiteLLM pre-call hook doing the filter's work.

It sets a header towards the upstream and puts a system message first. The
harness fills in the placeholders when it copies this file next to the
config.
"""

from litellm.integrations.custom_logger import CustomLogger

HEADER_NAME = "${HEADER_NAME}"
HEADER_VALUE = "${HEADER_VALUE}"
SYSTEM_PROMPT = "${SYSTEM_PROMPT}"


class Decorate(CustomLogger):
    async def async_pre_call_hook(self, user_api_key_dict, cache, data, call_type):
        if call_type not in ("completion", "acompletion"):
            return data
        data["messages"] = [{"role": "system", "content": SYSTEM_PROMPT}, *data.get("messages", [])]
        # The headers LiteLLM sends upstream (the forwarded client headers).
        data["headers"] = {**(data.get("headers") or {}), HEADER_NAME: HEADER_VALUE}
        return data


hook = Decorate()
