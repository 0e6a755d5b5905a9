"""The optimizer step in backward (`train.optimizer_in_backward`): each trainable parameter has its own
optimizer, stepped by the parameter's post-accumulate-grad hook as soon as its gradient is complete; the
gradient is then freed, so at most a parameter's worth of gradient is ever held instead of the whole model's
(as torchtune's `optimizer_in_bwd`).

`InBackwardOptimizer` stands for the per-parameter optimizers wherever the trainer holds "the optimizer":

- its one param group (`param_groups[0]`, all parameters) is what the LR scheduler writes; each hook copies
  the group's hyperparameters (lr, ...) into its parameter's optimizer before stepping, so the schedule
  applies exactly as it would to one optimizer;
- `state_dict` / `load_state_dict` use the format of one optimizer over all parameters in one group (state
  by parameter index), so checkpoints go through trainer/checkpoints/ unchanged and exact resume holds;
- `step()` steps only parameters that still hold a gradient (none in training: the hooks took them).

What it cannot do, because the whole gradient never exists: accumulate gradients over micro-batches
(train.grad_accum must be 1), clip by the global gradient norm (train.max_grad_norm is not applied), or scale
fp16 losses (fp16-mixed's scaler must see every gradient before any step); trainer/config.py and
trainer/layout.py refuse these, and more than one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

#: hyperparameters an LR scheduler may change in the shared group, copied into each parameter's optimizer
_SYNCED = ("lr", "weight_decay", "betas", "momentum", "eps")


class _StateView(Mapping[torch.Tensor, Any]):
    """`optimizer.state` over the per-parameter optimizers (read-only: for tracing and inspection)."""

    def __init__(self, optimizers: dict[torch.Tensor, torch.optim.Optimizer]) -> None:
        self._optimizers = optimizers

    def __getitem__(self, param: torch.Tensor) -> Any:
        return self._optimizers[param].state[param]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (p for p, opt in self._optimizers.items() if p in opt.state)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class InBackwardOptimizer(torch.optim.Optimizer):
    """One optimizer per parameter, stepped in backward; the trainer's optimizer object (see the module)."""

    in_backward = True

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
    ) -> None:
        self._params = list(params)
        self._optimizers = {p: make([p]) for p in self._params}
        first = next(iter(self._optimizers.values()))
        defaults = {k: v for k, v in first.defaults.items() if k != "params"}
        super().__init__(self._params, defaults)
        self.state = _StateView(self._optimizers)  # type: ignore[assignment]
        self._handles = [p.register_post_accumulate_grad_hook(self._hook) for p in self._params]

    def _hook(self, param: torch.Tensor) -> None:
        self._step_one(param)

    @torch.no_grad()
    def _step_one(self, param: torch.Tensor) -> None:
        optimizer = self._optimizers[param]
        group, shared = optimizer.param_groups[0], self.param_groups[0]
        for key in _SYNCED:
            if key in shared and key in group:
                group[key] = shared[key]
        optimizer.step()
        param.grad = None  # the gradient is spent: never held for the whole model

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """Step the parameters that still hold a gradient (none after a backward: the hooks stepped them)."""
        for param in self._params:
            if param.grad is not None:
                self._step_one(param)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The format of one optimizer over all parameters in one group: state by parameter index."""
        state: dict[int, Any] = {}
        for index, param in enumerate(self._params):
            own = self._optimizers[param].state_dict()["state"]
            if 0 in own:
                state[index] = own[0]
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self._params)))
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self._params):
            raise ValueError(
                f"optimizer state for {sum(len(g['params']) for g in groups)} parameters in {len(groups)} "
                f"group(s); this model trains {len(self._params)} in one"
            )
        group = {k: v for k, v in groups[0].items() if k != "params"}
        self.param_groups[0].update(group)
        saved = state_dict["state"]
        for index, param in enumerate(self._params):
            optimizer = self._optimizers[param]
            own_group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
            own_group.update({k: v for k, v in group.items() if k in own_group or k == "initial_lr"})
            own = {
                "state": {0: saved[index]} if index in saved else {},
                "param_groups": [{**own_group, "params": [0]}],
            }
            optimizer.load_state_dict(own)


def in_backward(optimizer: Any) -> bool:
    """Whether this optimizer steps in backward (trainer/train_step/step.py then skips its clip and step)."""
    return bool(getattr(optimizer, "in_backward", False))
