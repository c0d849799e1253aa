"""The base classes of every config section, apart from the tree (:mod:`hpcrl.config`) so that each
algorithm's config can live next to its algorithm without an import cycle."""
from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

LearningRate = Annotated[float, Field(gt=0, le=1)]
"""A learning rate: above 1 no optimiser here trains (Adam's step is about lr per weight), so it is refused."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True, strict=True,
                              allow_inf_nan=False)


class AlgoSection(Section):
    """Base of every algorithm's config: the facts it declares for the runtime's Plan (hpcrl.runtime.plan)."""

    round_regime: ClassVar[str] = "fragment"
    """batch: a round is algo.train_batch_size env steps, split over the learner groups; fragment: a round is
    algo.round_fragments actor fragments (FragmentRounds), and a learner group trains each fragment it gets."""
    fused_loop: ClassVar[bool] = False
    """The serial runner may fuse the roles into one device loop for it (hpcrl.runtime.runners.fused: HA2C, HDDPG)."""

    def instances_per_copy(self) -> int:
        """Instances in one env copy (a fragment's steps are fragment_length x num_envs x this)."""
        return 1

    def routing(self) -> str:
        """Where actors send fragments: own_group, every_group or postprocess_first (hpcrl.runtime.plan)."""
        return "own_group"

    def lr_schedule(self):
        """The rate rank 0 sets before each step (hpcrl.algos.schedules), or None: the optimiser's constant lr."""
        return None

    def reported_lr(self) -> float:
        """The learning rate the ``updates`` table reports when no schedule sets one (the policy's)."""
        return self.lr

    def gradient_rows(self, fragment_steps: int) -> int:
        """Rows (env or agent steps) one gradient push is computed over, what the virtual-time runner prices a
        learner's gradient by: here a whole fragment (HA2C, HDDPG)."""
        return fragment_steps

    def reward_discount(self) -> float:
        """The discount of the return whose std normalises rewards (env.normalize_reward)."""
        return self.gamma

    def resolve(self, run: Any) -> None:
        """Fill the settings left null that the rest of the run decides. The run's config.yaml records the
        filled values, so a resume that changes the rest (stop.total_env_steps, actors.count) keeps them."""

    def check_run(self, run: Any) -> None:
        """Raise ValueError (one line) for a combination with the rest of the run this algorithm cannot train."""


class FragmentRounds(Section):
    """Fields of an algorithm whose round is a number of actor fragments (round_regime fragment)."""

    round_fragments: int | None = Field(None, ge=1)
    """Actor fragments that make one round (the unit of algo.end_round, stop.max_rounds and eval.every_rounds); null: one per actor rank, actors.count at the run's start, written into config.yaml so that a resume with more or fewer actors keeps the round."""

    def resolve(self, run: Any) -> None:
        super().resolve(run)
        if self.round_fragments is None:
            self.round_fragments = run.actors.count
