import pytest

from utils.schedule import Schedule

HYP = {"lr0": 0.01, "lrf": 0.01, "momentum": 0.937, "weight_decay": 0.0005, "warmup_epochs": 3.0,
       "warmup_momentum": 0.8, "warmup_bias_lr": 0.1, "lr_auto_gain": 4.0}


def plan(epochs, batches, pretrained, **hyp):
    return Schedule.plan({**HYP, **hyp}, "auto", epochs=epochs, total_batch=16, n_images=16 * batches,
                         batches=batches, nc=80, pretrained=pretrained)


@pytest.mark.parametrize("epochs, batches, warmup_epochs, want", [
    (20, 8, 3.0, 24),  # no floor of 100: it spanned 12 of COCO128's 20 epochs and held fine-tuning back
    (300, 7393, 3.0, 22179),  # COCO at batch 16
    (3, 8, 3.0, 16),  # at most epochs - 1: the last epoch trains at the scheduled rate
    (1, 8, 3.0, -1),  # a one-epoch fine-tuning has no warmup
    (20, 8, 0.0, -1),
    (20, 8, 0.5, 4),
])
def test_fine_tuning_warms_up_for_its_epochs_and_leaves_the_last_one(epochs, batches, warmup_epochs, want):
    assert plan(epochs, batches, True, warmup_epochs=warmup_epochs).warmup_iters == want


@pytest.mark.parametrize("epochs, batches, warmup_epochs, want", [
    (20, 8, 3.0, 100),  # from scratch the floor stays (the shorter warmup lost on the shapes sets)
    (1, 8, 3.0, 100),
    (300, 7393, 3.0, 22179),
    (20, 8, 0.0, -1),
])
def test_training_from_scratch_warms_up_at_least_100_batches(epochs, batches, warmup_epochs, want):
    assert plan(epochs, batches, False, warmup_epochs=warmup_epochs).warmup_iters == want


def test_fine_tuning_ramps_lr_and_accumulation_over_its_shorter_warmup():
    s = plan(20, 8, True)
    assert (s.optimizer, s.lr0, s.accumulate) == ("AdamW", 0.000119, 4)  # the Ultralytics fit for 80 classes
    assert [s.accumulate_at(k) for k in (0, 12, 24, 25)] == [1, 2, 4, 4]


@pytest.mark.parametrize("optimizer, pretrained, epochs, want", [
    ("auto", True, 20, 10.0),  # a short fine-tuning: AdamW at the fit; new tensors at lr_new_gain x
    ("auto", False, 20, 1.0),  # from scratch every tensor is new, and steps at lr_auto_gain x the fit already
    ("auto", True, 6000, 1.0),  # a long run (12,000 steps): SGD at lr0, where a new layer has time to leave its start
    ("AdamW", True, 20, 1.0),  # the user's own optimizer and lr0 are taken as given
    ("SGD", True, 20, 1.0),
])
def test_only_a_short_auto_fine_tuning_steps_new_tensors_faster(optimizer, pretrained, epochs, want):
    s = Schedule.plan({**HYP, "lr_new_gain": 10.0}, optimizer, epochs=epochs, total_batch=16, n_images=128,
                      batches=8, nc=80, pretrained=pretrained)
    assert s.new_lr0 == pytest.approx(s.lr0 * want)


def test_new_tensors_step_as_the_others_unless_a_hyp_says_otherwise():
    assert plan(20, 8, True).new_lr0 == plan(20, 8, True).lr0
