import cv2
import numpy as np
import pytest
import torch

from data.augment import (
    HSV_CHUNK,
    PAD_VALUE,
    Canvas,
    Instances,
    apply_hsv,
    apply_hsv_batch,
    augment_hsv,
    chw_rgb,
    copy_paste,
    hsv_gains,
    hsv_tables,
    letterbox,
    mixup,
    polygons_to_masks,
    random_perspective,
)


def test_letterbox_geometry():
    im = np.full((100, 200, 3), 7, np.uint8)
    out, ratio, (pw, ph) = letterbox(im, 64, auto=False)
    assert out.shape == (64, 64, 3) and ratio == (0.32, 0.32) and (pw, ph) == (0.0, 16.0)
    assert (out[:16] == 114).all() and (out[48:] == 114).all() and (out[16:48] == 7).all()
    auto, _, (pw, ph) = letterbox(im, 64, auto=True, stride=32)
    assert auto.shape == (32, 64, 3) and ph == 0
    small = np.zeros((10, 20, 3), np.uint8)
    kept, ratio, _ = letterbox(small, (64, 64), auto=False, scaleup=False)
    assert ratio == (1.0, 1.0) and kept.shape == (64, 64, 3)
    odd, _, (pw, ph) = letterbox(np.zeros((30, 64, 3), np.uint8), (64, 64), auto=False)
    assert odd.shape == (64, 64, 3) and ph == 17.0


@pytest.mark.parametrize("seed", range(4))
def test_random_perspective_boxes_and_polygons_follow_the_pixels(seed):
    """Warp an image holding one white polygon; the returned box/polygon must match where the pixels went."""
    img = np.zeros((128, 160, 3), np.uint8)
    poly = np.array([[40, 30], [110, 40], [90, 100], [50, 90]], np.float32)
    cv2.fillPoly(img, [poly.astype(np.int32)], (255, 255, 255))
    box = np.concatenate([poly.min(0), poly.max(0)])[None]
    rng = np.random.default_rng(seed)
    for segments in (None, [poly]):
        out, inst = random_perspective(img, Instances(np.zeros(1, np.float32), box.copy(), segments), degrees=30,
                                       translate=0.1, scale=0.3, shear=10, perspective=0.0005, rng=rng)
        assert out.shape == img.shape
        ys, xs = np.nonzero(out[..., 0] > 127)
        if len(inst) == 0:
            continue
        seen = np.array([xs.min(), ys.min(), xs.max(), ys.max()])
        if segments is None:  # warped box corners: the box contains the shape
            assert (inst.boxes[0, :2] <= seen[:2] + 2).all() and (inst.boxes[0, 2:] >= seen[2:] - 2).all()
        else:  # warped outline: the box is tight, and the outline covers the pixels
            np.testing.assert_allclose(inst.boxes[0], seen, atol=2.5)
            mask = np.zeros(img.shape[:2], np.uint8)
            cv2.fillPoly(mask, [np.round(inst.segments[0]).astype(np.int32)], 1)
            white = out[..., 0] > 127
            assert (mask.astype(bool) & white).sum() / (mask.astype(bool) | white).sum() > 0.9


def test_mosaic_border_crops_and_small_boxes_dropped():
    img = np.zeros((200, 200, 3), np.uint8)
    inst = Instances(np.array([0, 1], np.float32), np.array([[60, 60, 140, 140], [0, 0, 3, 3]], np.float32))
    out, kept = random_perspective(img, inst, translate=0, scale=0, border=(-50, -50), rng=np.random.default_rng(0))
    assert out.shape == (100, 100, 3)
    assert kept.cls.tolist() == [0]  # the 3 px box near the corner is cut away
    np.testing.assert_allclose(kept.boxes[0], [10, 10, 90, 90], atol=1e-4)


def test_flips_and_instances():
    seg = np.array([[10, 5], [30, 5], [30, 25]], np.float32)
    inst = Instances(np.array([2.0], np.float32), np.array([[10, 5, 30, 25]], np.float32), [seg.copy()])
    inst.flip(width=100)
    np.testing.assert_allclose(inst.boxes[0], [70, 5, 90, 25])
    np.testing.assert_allclose(inst.segments[0][:, 0], [90, 70, 70])
    inst.flip(height=50)
    np.testing.assert_allclose(inst.boxes[0], [70, 25, 90, 45])
    both = Instances.concat([inst, Instances(np.zeros(1, np.float32), np.zeros((1, 4), np.float32), None)])
    assert len(both) == 2 and both.segments is None
    assert both.select([1]).cls.tolist() == [0.0]


def test_hsv_and_mixup():
    img = np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8)
    same = augment_hsv(img.copy(), 0, 0, 0)
    np.testing.assert_array_equal(same, img)
    changed = augment_hsv(img.copy(), 0.5, 0.5, 0.5, np.random.default_rng(1))
    assert changed.shape == img.shape and not np.array_equal(changed, img)
    a, b = np.zeros((8, 8, 3), np.uint8), np.full((8, 8, 3), 200, np.uint8)
    ia = Instances(np.zeros(1, np.float32), np.ones((1, 4), np.float32))
    out, inst = mixup(a, ia, b, Instances(np.ones(2, np.float32), np.ones((2, 4), np.float32)),
                      np.random.default_rng(0))
    assert len(inst) == 3 and 60 < out.mean() < 140  # a Beta(32, 32) blend stays near half-way


def test_polygons_to_masks_overlap_order():
    big = np.array([[0, 0], [60, 0], [60, 60], [0, 60]], np.float32)
    small = np.array([[20, 20], [40, 20], [40, 40], [20, 40]], np.float32)
    masks, order = polygons_to_masks([small, big], (64, 64), ratio=4, overlap=True)
    assert order.tolist() == [1, 0] and masks.shape == (16, 16)
    assert (masks[5:10, 5:10] == 2).all() and masks[1, 1] == 1 and masks[15, 15] == 0
    sep, order = polygons_to_masks([small, big], (64, 64), ratio=4, overlap=False)
    assert sep.shape == (2, 16, 16) and order.tolist() == [0, 1]
    assert sep[0].sum() == 25 and sep[1].sum() == 225
    empty, _ = polygons_to_masks([], (64, 64), ratio=4, overlap=False)
    assert empty.shape == (0, 16, 16)


def test_copy_paste_mirrors_instances_that_do_not_hide_others():
    img = np.zeros((64, 80, 3), np.uint8)
    square = np.array([[8, 10], [24, 10], [24, 30], [8, 30]], np.float32)  # left side: its mirror is free
    centre = np.array([[36, 40], [44, 40], [44, 50], [36, 50]], np.float32)  # its mirror is itself: refused
    img[10:30, 8:24] = (10, 200, 30)
    img[40:50, 36:44] = (250, 0, 0)
    inst = Instances(np.array([1.0, 2.0], np.float32), np.array([[8, 10, 24, 30], [36, 40, 44, 50]], np.float32),
                     [square, centre])
    before = img.copy()
    out, res = copy_paste(img, inst, 1.0, np.random.default_rng(0))
    assert res.cls.tolist() == [1.0, 2.0, 1.0]
    np.testing.assert_allclose(res.boxes[2], [80 - 24, 10, 80 - 8, 30])
    np.testing.assert_allclose(res.segments[2][:, 0], 80 - square[:, 0])
    assert (out[11:29, 57:71] == (10, 200, 30)).all()  # the copy's pixels are the square's
    changed = (out != before).any(2)
    assert changed.sum() == changed[10:31, 56:73].sum() > 0  # nothing else moved
    same, kept = copy_paste(before.copy(), inst, 0.0, np.random.default_rng(0))
    assert kept is inst and (same == before).all()


def test_hsv_gains_are_per_channel_lookups():
    """The HSV augmentation is three lookup tables on OpenCV's HSV image: hue * g mod 180, saturation and value
    * g clipped to 255 (checked channel by channel, against tables applied one at a time)."""
    img = np.random.default_rng(0).integers(0, 256, (32, 48, 3), dtype=np.uint8)
    out = augment_hsv(img.copy(), 0.5, 0.7, 0.4, np.random.default_rng(5))
    g = np.random.default_rng(5).uniform(-1, 1, 3) * [0.5, 0.7, 0.4] + 1
    x = np.arange(256)
    hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)
    tables = [((x * g[0]) % 180).astype(np.uint8), np.clip(x * g[1], 0, 255).astype(np.uint8),
              np.clip(x * g[2], 0, 255).astype(np.uint8)]
    want = np.stack([t[hsv[..., c]] for c, t in enumerate(tables)], -1)
    assert np.array_equal(out, cv2.cvtColor(want, cv2.COLOR_HSV2BGR))


@pytest.mark.parametrize("hyp", [(0.015, 0.7, 0.4), (0.5, 0.9, 0.9), (0.0, 0.0, 0.3)])
def test_hsv_on_the_device_gives_the_loaders_pixels(hyp):
    """The batch form (the device's) against OpenCV's per image (the loader's), each image with its own drawn gains,
    on smooth and noise images: none more than one grey level apart, nearly all equal."""
    rng = np.random.default_rng(3)
    smooth = [cv2.GaussianBlur(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), (7, 7), 2) for _ in range(3)]
    noise = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(3)]
    ims = [cv2.resize(im, (256, 192), interpolation=cv2.INTER_NEAREST) for im in smooth + noise]
    gains = [hsv_gains(*hyp, rng) for _ in ims]
    want = np.stack([chw_rgb(apply_hsv(im.copy(), g)) for im, g in zip(ims, gains)]).astype(np.float32)
    x = torch.from_numpy(np.stack([chw_rgb(im) for im in ims])).float() / 255
    tables = torch.from_numpy(np.stack([hsv_tables(g) for g in gains]))
    got = apply_hsv_batch(x, tables).numpy() * 255
    diff = np.abs(got - want)
    assert diff.max() <= 1 + 1e-4 and (diff < 1e-4).mean() > 0.98  # OpenCV's own rounding varies with the CPU
    swapped = apply_hsv_batch(x, tables.flip(0)).numpy() * 255
    assert np.abs(swapped - want).mean() > 1  # each image its own gains
    assert hsv_gains(0, 0, 0, rng) is None


def test_hsv_on_the_device_in_chunks_is_image_by_image():
    """A batch larger than a pass (HSV_CHUNK) gives each image what it gets alone, with its own tables."""
    rng = np.random.default_rng(4)
    n = HSV_CHUNK + 3
    x = torch.from_numpy(rng.integers(0, 256, (n, 3, 8, 40))).float() / 255
    tables = torch.from_numpy(np.stack([hsv_tables(hsv_gains(0.5, 0.9, 0.9, rng)) for _ in range(n)]))
    alone = torch.cat([apply_hsv_batch(x[i : i + 1], tables[i : i + 1]) for i in range(n)])
    assert torch.equal(apply_hsv_batch(x, tables), alone) and not torch.equal(alone[-1], alone[-2])


def test_hsv_on_the_device_wraps_a_hue_of_180_as_opencv():
    """A hue gain a hair below 0 makes the hue table hold 180 ((x * g) % 180 rounds up), which OpenCV wraps to 0."""
    tables = hsv_tables(np.array([-1e-15, 1.0, 1.0]))
    assert tables[0].max() == 180
    im = cv2.resize(np.random.default_rng(0).integers(0, 256, (8, 16, 3), dtype=np.uint8), (256, 128),
                    interpolation=cv2.INTER_NEAREST)
    want = chw_rgb(apply_hsv(im.copy(), np.array([-1e-15, 1.0, 1.0]))).astype(np.float32)
    got = apply_hsv_batch(torch.from_numpy(chw_rgb(im))[None].float() / 255, torch.from_numpy(tables)[None])
    assert np.abs(got[0].numpy() * 255 - want).max() <= 1 + 1e-4


@pytest.mark.parametrize("view", [lambda a: a, np.fliplr, lambda a: a[::2, 1:]])
def test_chw_rgb_is_the_channel_reversed_transpose(view):
    img = view(np.random.default_rng(0).integers(0, 256, (32, 48, 3), dtype=np.uint8))
    out = chw_rgb(img)
    assert out.flags.c_contiguous and out.dtype == np.uint8
    assert np.array_equal(out, img[..., ::-1].transpose(2, 0, 1))


@pytest.mark.parametrize("params", [
    dict(degrees=0.0, translate=0.1, scale=0.5, shear=0.0, perspective=0.0),  # YOLOv8's default: scale and shift
    dict(degrees=0.0, translate=0.4, scale=0.9, shear=0.0, perspective=0.0),  # far off the output, and zoomed
    dict(degrees=30.0, translate=0.3, scale=0.9, shear=10.0, perspective=0.0),  # drawn whole
    dict(degrees=5.0, translate=0.1, scale=0.5, shear=2.0, perspective=0.001),  # drawn whole
])
def test_a_mosaic_canvas_warped_where_it_is_read_gives_the_whole_canvas_pixels(params):
    """The warp draws only the window of the mosaic canvas it reads; pixels and labels must equal those of the
    canvas drawn whole, for draws that zoom in and out and push the picture off the output."""
    gen = np.random.default_rng(0)
    s = 96
    for trial in range(200):
        pieces, boxes = [], []
        xc, yc = (int(v) for v in gen.uniform(s // 2, 3 * s // 2, 2))
        for k in range(4):
            h, w = (int(v) for v in gen.integers(20, s + 1, 2))
            img = gen.integers(0, 256, (h, w, 3), dtype=np.uint8)
            ox, oy = (xc - w if k in (0, 2) else xc), (yc - h if k in (0, 1) else yc)
            pieces.append((img, ox, oy))
            boxes.append([ox + w / 4, oy + h / 4, ox + w * 3 / 4, oy + h * 3 / 4])
        canvas = Canvas(2 * s, 2 * s, pieces)
        inst = Instances(np.arange(4, dtype=np.float32), np.clip(np.array(boxes, np.float32), 0, 2 * s), None, None)
        whole = canvas.draw()
        assert whole.shape == (2 * s, 2 * s, 3) and (whole == PAD_VALUE).any()
        lazy_img, lazy_inst = random_perspective(canvas, inst, **params, border=(-s // 2, -s // 2),
                                                 rng=np.random.default_rng(trial))
        ref_img, ref_inst = random_perspective(whole, inst, **params, border=(-s // 2, -s // 2),
                                               rng=np.random.default_rng(trial))
        assert lazy_img.shape == ref_img.shape == (s, s, 3)
        assert np.array_equal(lazy_img, ref_img), (trial, int((lazy_img != ref_img).sum()))
        assert np.array_equal(lazy_inst.boxes, ref_inst.boxes) and np.array_equal(lazy_inst.cls, ref_inst.cls)
