"""Runs one of the tinker-cookbook's own training loops, in the cookbook's environment, on settings from a JSON
file, and writes what ran to a result file:

    .venv-cookbook/bin/python services/tooling/tinker/cookbook/loops.py SETTINGS.json RESULT.json

SETTINGS holds `loop` ("sl": tinker_cookbook.supervised.train, or "rl": tinker_cookbook.rl.train), `config`, the
keyword arguments of that module's own Config but its dataset builder, and `dataset`, the builder's: for "sl" the
cookbook's FromConversationFileBuilder (a local conversation JSONL file; `common` holds its
ChatDatasetBuilderCommonConfig), for "rl" sums.SumsDatasetBuilder. The loop reaches the Tinker front through
`config.base_url` and the TINKER_API_KEY variable, as it would reach Tinker. Its metrics and checkpoints are the
cookbook's own files in `config.log_path` (metrics.jsonl, checkpoints.jsonl).

`loop` "eval" trains nothing: the cookbook's RLTestSetEvaluator plays the held-out set of sums.SumsDatasetBuilder
with a sampler of `config.model_path` (the base model when it is absent) and the result holds its metrics, so an
evaluation before and after a loop stays out of the loop's time."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path


def supervised(config: dict, dataset: dict):
    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    common = ChatDatasetBuilderCommonConfig(**dataset.pop("common"))
    builder = FromConversationFileBuilder(common_config=common, **dataset)
    return train, train.Config(dataset_builder=builder, **config)


def reinforcement(config: dict, dataset: dict):
    # sums.py sits beside this script, whose folder its interpreter puts first on sys.path.
    from sums import SumsDatasetBuilder
    from tinker_cookbook.rl import train

    return train, train.Config(dataset_builder=SumsDatasetBuilder(**dataset), **config)


async def evaluate(config: dict, dataset: dict) -> dict[str, float]:
    import tinker
    from sums import SumsDatasetBuilder
    from tinker_cookbook.rl.metric_util import RLTestSetEvaluator

    _, held_out = await SumsDatasetBuilder(**dataset)()
    service = tinker.ServiceClient(base_url=config["base_url"])
    model_path = config.get("model_path")
    sampler = await service.create_sampling_client(model_path=model_path,
                                                   base_model=None if model_path else config["model_name"])
    return await RLTestSetEvaluator(held_out, max_tokens=config["max_tokens"])(sampler)


LOOPS = {"sl": supervised, "rl": reinforcement}


def main(settings_path: str, result_path: str) -> None:
    import tinker_cookbook

    settings = json.loads(Path(settings_path).read_text())
    started = time.monotonic()
    if settings["loop"] == "eval":
        from tinker_cookbook.rl import metric_util as module

        ran = {"metrics": asyncio.run(evaluate(settings["config"], settings["dataset"]))}
    else:
        module, config = LOOPS[settings["loop"]](settings["config"], settings["dataset"])
        asyncio.run(module.main(config))
        ran = {"log_path": config.log_path}
    Path(result_path).write_text(json.dumps({
        "loop": settings["loop"], "seconds": round(time.monotonic() - started, 2),
        "cookbook_version": tinker_cookbook.__version__, "train_module": module.__file__, **ran,
    }))


if __name__ == "__main__":
    main(*sys.argv[1:])
