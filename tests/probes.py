"""Test probes that look inside a trainer, as no listener may (a listener reads its event, engine/callbacks.py):
`probing(DetectionTrainer, {"on_train_start": [fn]})` is that trainer class calling `fn(trainer)` after the event's
listeners, on the ranks the event fires on. A probe's exception ends the run, as a test that stops a run wants."""

from engine.callbacks import EVERY_RANK


def probing(trainer_cls, hooks):
    class Probed(trainer_cls):
        def run_callbacks(self, event, **data):
            super().run_callbacks(event, **data)
            if self.run.is_main or event in EVERY_RANK:
                for fn in hooks.get(event, ()):
                    fn(self)

    return Probed
