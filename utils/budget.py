"""What a file handed to the project may cost before it is refused: the budget, in one place.

docs/safety.md states each figure with the legitimate files it leaves room for (the largest official model, COCO's
largest image and label file), and where it is enforced; every check runs before the allocation it bounds.
"""

MAX_IMAGE_PIXELS = 89_478_485  # PIL's decompression-bomb limit (Image.MAX_IMAGE_PIXELS): 256 MiB as 8-bit BGR
MAX_IMAGE_HEADER_BYTES = 1 << 20  # a JPEG's markers before its frame header (EXIF, ICC profiles in 64 KiB pieces)
# one label file: 230 polygons of 1000 points, 100,000 boxes (parsing costs about 15x its size in memory, and time in
# proportion to its size)
MAX_LABEL_BYTES = 4 << 20
MAX_YAML_BYTES = 4 << 20  # a dataset, model or hyperparameter YAML (ImageNet-21k's names: 0.5 MiB)
MAX_YAML_NODES = 1_000_000  # values a YAML describes once its aliases are unfolded
MAX_PICKLE_BYTES = 64 << 20  # a checkpoint's data.pkl (an official YOLOv8x tree: 0.3 MiB)
MAX_PICKLE_STACK = 4096  # values a pickle keeps on its stack at once (pickle writes lists and dicts 1000 at a time)
MAX_NESTING = 64  # containers in containers (official module trees: about 15, model.model[i].m[j].cv1.conv._parameters)
# a model YAML (given as --cfg, or inside a checkpoint), as the memory it takes: its weights as float32, and those plus
# the activations of one image's forward pass at MODEL_PROBE_SIDE px, counted by a dry run (the largest of models/:
# YOLOv7-E6E's 166 M weights, 635 MiB; with its activations at 640 px, 2.5 GiB)
MAX_WEIGHT_BYTES = 1 << 30
MAX_MODEL_BYTES = 3 << 30
MODEL_PROBE_SIDE = 640
MAX_CLASSES = 100_000  # a model's classes (ImageNet-21k: 21,841)
# a forward pass: bytes of every operator's output, and operations, per input value (measured on every model of
# models/ at its largest scale, 640 px: at most 1.5 KiB and 0.22 M, YOLOv8x-P2; 2.6x and 4.5x that leave room for
# wider models of one's own)
ACTIVATION_BYTES_PER_INPUT = 4096
WORK_PER_INPUT = 1_000_000
# what does not grow with the input (constants a graph makes, arithmetic on its weights): this, plus 4x the bytes of
# the file (official exports: anchor grids of a few KiB)
CONSTANT_BYTES = 64 << 20
MAX_GRAPH_NODES = 100_000  # operators of an ONNX graph, each dry-run in Python (official exports: under 2,000)
# the input an exported file declares, which a static export is padded to: at most 2^27 values, 512 MiB of float32
# (batch 32 at 1152 px; batch 16 at 1600)
MAX_EXPORT_BATCH, MAX_EXPORT_SIDE, MAX_EXPORT_INPUT = 1024, 8192, 1 << 27
# an image size: --img, and one read from a file (a checkpoint's run record, an export's metadata, resumed options),
# checked alike; one image at it is 192 MiB as the network's float32 input (official models train at 640 and 1280)
MAX_IMGSZ = 4096
ARCHIVE_RATIO = 100  # what an archive unpacks to, per byte it has (JPEG datasets: 1; label text: 5-10)
ARCHIVE_FLOOR = 64 << 20  # ... or at least this much, whatever its size
DISK_MARGIN = 1 << 30  # a download or unpacking leaves this much of its disk free
INFERENCE_SECONDS = 120  # a forward pass of an exported graph, plus WORK_PER_SECOND below
WORK_PER_SECOND = 1e8  # operations a second any CPU does: 50x under this 2-core machine's convolutions
# --cache disk / ram: what the cached pixels take, from the images' headers, before the first is written: within the
# free disk (less DISK_MARGIN) or the memory this process may still take (less MEMORY_MARGIN), and at most
# CACHE_RATIO times the bytes of the image files (at least CACHE_FLOOR): JPEG photos decode to about 10x their size
CACHE_RATIO = 100
CACHE_FLOOR = 256 << 20
MEMORY_MARGIN = 1 << 30
MAX_DECODE_BYTES = 1 << 30  # images decoded at once while caching (8 threads, fewer for images near the pixel limit)
# a val or predict batch, as the memory its forward pass holds at its peak: EVAL_PEAK_FACTOR times what a dry run at
# the image size counts as live at once (the real peak over a dry run's, measured on a CPU: 1.24-1.81, YOLOv8x at
# 1280 px to YOLOv8x-seg at 640), plus the batch's input as uint8 and float32; EVAL_BYTES_PER_INPUT per input value
# where no dry run can count (an export, a dry run that fails: the official models' real peaks are 24-241). The batch
# must fit in EVAL_MEMORY_FRACTION of the memory the process may still take (each rank its part; the loader, the
# post-processing and the machine's other processes need the rest); a smaller batch is taken where it does not
EVAL_PEAK_FACTOR = 2
EVAL_BYTES_PER_INPUT = 512
EVAL_MEMORY_FRACTION = 0.5
# an export traces one forward pass of its batch and keeps the graph's values while it writes the file: counted as
# EXPORT_TRACE_FACTOR evaluations (YOLOv8n at 4096 px: export.py peaked at 3.3 GB where val.py at batch 1 held 2.2)
EXPORT_TRACE_FACTOR = 2
# a segmentation val decodes each image's masks at the input size, one image at a time: up to --max-det of them, each
# this many bytes a pixel (float logits, resized, cropped, thresholded: measured 14-14.5 on YOLOv8x-seg at 640 and
# 1280 px with 300 masks an image)
MASK_DECODE_BYTES = 16
# listing a split or a --source: a list .txt file's bytes (Objects365's 1.7 M lines: 120 MB), and the entries one
# scan may meet (list lines, folder entries and glob matches, repeats counted: twice the largest public sets with
# their label files beside the images); a scan running longer than SCAN_NOTE_SECONDS says how far it has got
MAX_LIST_BYTES = 256 << 20
MAX_SCAN_ENTRIES = 4_000_000
SCAN_NOTE_SECONDS = 10
# live sources: at most this many at once (a .streams file), whose frames hold at most this many pixels together
# (four 4K streams, sixteen at 1080p); each 4K stream's reader holds about 75 MB besides
MAX_STREAMS = 32
MAX_STREAM_PIXELS = 4 * 3840 * 2160
MAX_STREAMS_FILE_BYTES = 1 << 20  # a .streams file: MAX_STREAMS URLs and their comments
# a dataset YAML's `synthetic:` entry: images counted as the square of their largest side plus what writing a file
# costs (64 Ki pixels' worth), sides up to 1024 px, up to 16 shapes an image: the project's shapes sets are 95 M and
# take 6 s on a 2-core CPU, this bound 10-20 s and 35 MB
MAX_SYNTHETIC_PIXELS = 150_000_000
SYNTHETIC_FILE_PIXELS = 1 << 16
MAX_SYNTHETIC_SIDE, MAX_SYNTHETIC_OBJECTS = 1024, 16


