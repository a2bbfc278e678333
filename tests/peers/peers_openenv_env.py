"""An environment written against OpenEnv alone (openenv-core's Environment, Action, Observation and its server),
served on a port: `python peers_openenv_env.py PORT`. The model guesses a number; the server says higher or lower."""

import sys

import uvicorn
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    prompt: str = ""
    guesses: int = 0


class GuessNumber(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self.target, self.guesses = 7, 0

    def reset(self, seed=None, episode_id=None, row: dict | None = None, **kwargs) -> GuessObservation:
        self.target = int((row or {}).get("ground_truth", 7))
        self.guesses = 0
        return GuessObservation(prompt=" Guess my number between 1 and 10.")

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        self.guesses += 1
        digits = "".join(ch for ch in action.message if ch.isdigit())
        if digits and int(digits) == self.target:
            return GuessObservation(prompt="right", guesses=self.guesses, reward=1.0, done=True)
        hint = "higher" if not digits or int(digits) < self.target else "lower"
        return GuessObservation(prompt=hint, guesses=self.guesses, reward=-0.1, done=False)

    @property
    def state(self) -> State:
        return State(step_count=self.guesses)


app = create_fastapi_app(GuessNumber, GuessAction, GuessObservation, max_concurrent_envs=16)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
