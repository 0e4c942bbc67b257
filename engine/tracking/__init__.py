"""Multi-object tracking on the predictors' detections: ByteTrack and BoT-SORT (tracker.py), their settings
(config.py, data/trackers/*.yaml), and what a tracked video leaves (mot.py: the MOT text file, id trails)."""
