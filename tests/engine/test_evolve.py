"""--evolve's options: each generation trains with its own typed copy of the search's options, the command line's
`given` passed on with it, and the caller's options are left as they were."""

import copy

import train
from engine.evolve import evolve
from engine.options import DetectTrainOptions
from engine.tasks import TASKS

DetectionTrainer = TASKS["detect"].trainer


def test_each_generation_gets_its_own_options_and_the_command_line_s_names(tmp_path):
    parsed = train.parse_opt(["--project", str(tmp_path), "--evolve", "2", "--cfg", "yolov5n.yaml", "--weights",
                              "x.pt", "--name", "search"])
    opt = parsed.opt
    before = copy.deepcopy(vars(opt))
    seen = []

    def run(trainer_cls, gen_opt, given):
        seen.append((gen_opt, given))
        return None, {"fitness": 0.1 * len(seen)}

    out = evolve(DetectionTrainer, parsed, run)
    assert vars(opt) == before
    (first, given0), (second, given1) = seen
    assert type(first) is type(second) is DetectTrainOptions and first is not second
    assert given0 == given1 == parsed.given and "cfg" in given0  # so no generation trains --weights' own model
    for g, gen_opt in enumerate((first, second)):
        assert (gen_opt.name, gen_opt.project, gen_opt.hyp) == (f"gen{g}", str(out.parent),
                                                                 str(out.parent / f"gen{g}_hyp.yaml"))
        assert (gen_opt.evolve, gen_opt.noval, gen_opt.nosave, gen_opt.noplots, gen_opt.exist_ok) == \
            (None, True, True, True, False)
        assert (gen_opt.cfg, gen_opt.weights, gen_opt.train_checkpoint_model) == ("yolov5n.yaml", "x.pt", False)
    assert out.parent.name == "search"
