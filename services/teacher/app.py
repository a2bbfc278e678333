"""Assembles the teacher service: the frozen model, its core, servicer and host."""

from __future__ import annotations

import logging

from zerobubble.common.server import ServiceHost
from zerobubble.teacher.config import TeacherServiceConfig
from zerobubble.teacher.core import TeacherCore
from zerobubble.teacher.metrics import TeacherMetrics
from zerobubble.teacher.servicer import TeacherServicer
from zerobubble.v1 import teacher_pb2_grpc

log = logging.getLogger(__name__)

CONFIG_SCHEMA = TeacherServiceConfig
SERVICE_NAME = "zerobubble.v1.TeacherService"


def build(config: TeacherServiceConfig, scorer=None) -> ServiceHost:
    """The teacher service with its model loaded, not yet started (call `start()`). `scorer`: the model to serve in
    place of config.model's (a test's faulty teacher)."""
    if scorer is None:
        from zerobubble.teacher.model import TeacherModel  # torch: only where a model is served

        scorer = TeacherModel(config.model)
    host = ServiceHost("teacher", config.server)
    core = TeacherCore(scorer, config.limits, TeacherMetrics(host.registry))
    host.core = core
    host.add(teacher_pb2_grpc.add_TeacherServiceServicer_to_server, TeacherServicer(core), SERVICE_NAME)
    log.info("teacher %s (tokenizer %s) ready to score", scorer.path, scorer.tokenizer_name)
    return host
