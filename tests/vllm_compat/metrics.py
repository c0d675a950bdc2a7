"""vLLM's metrics example: LLM.get_metrics() after a generate call."""

import os

from minengine import LLM, SamplingParams
from minengine.v1.metrics.reader import Counter, Gauge, Histogram, Vector

MODEL = os.environ.get("MODEL", "minengine/assets/tiny-shakespeare-llama")
prompts = ["ROMEO:", "JULIET:", "HAMLET:", "OTHELLO:"]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)


def main():
    llm = LLM(model=MODEL, disable_log_stats=False)
    outputs = llm.generate(prompts, sampling_params)
    print("-" * 50)
    for output in outputs:
        print(f"Prompt: {output.prompt!r}\nGenerated text: {output.outputs[0].text!r}")
        print("-" * 50)
    names = set()
    for metric in llm.get_metrics():
        names.add(metric.name)
        if isinstance(metric, Gauge):
            print(f"{metric.name} (gauge) = {metric.value}")
        elif isinstance(metric, Counter):
            print(f"{metric.name} (counter) = {metric.value}")
        elif isinstance(metric, Vector):
            print(f"{metric.name} (vector) = {metric.values}")
        elif isinstance(metric, Histogram):
            print(f"{metric.name} (histogram)")
            print(f"    sum = {metric.sum}")
            print(f"    count = {metric.count}")
            for bucket_le, value in metric.buckets.items():
                print(f"    {bucket_le} = {value}")
    assert {"vllm:num_requests_running", "vllm:generation_tokens", "vllm:time_to_first_token_seconds"} <= names


if __name__ == "__main__":
    main()
