"""Datasets, augmentation, loaders, dataset YAMLs, prediction sources and the synthetic shapes generator."""
