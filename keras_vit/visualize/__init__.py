"""The paper's visualisations: numbers in `analysis`, PNGs in `plots`, a CLI in `__main__`.

    maps = attention_rollout(model, images)            # [N, gh, gw]
    sim = position_embedding_similarity(model)         # [gh, gw, gh, gw]
    filters = embedding_filters(model, n=28)           # [n, P, P, C]
    dist = mean_attention_distance(model, images)      # [layers, heads], pixels
    rgb = overlay(image, maps[0])                      # [H, W, 3] uint8
"""

from keras_vit.visualize.analysis import (attention_distance, attention_rollout, attention_weights,
                                          embedding_filters, mean_attention_distance,
                                          position_embedding_similarity, position_embeddings, rollout,
                                          rollout_maps)
from keras_vit.visualize.plots import (overlay, plot_attention_distance, plot_filters,
                                       plot_position_similarity, plot_rollout)

__all__ = [
    "attention_distance", "attention_rollout", "attention_weights", "embedding_filters",
    "mean_attention_distance", "position_embedding_similarity", "position_embeddings", "rollout",
    "rollout_maps", "overlay", "plot_attention_distance", "plot_filters", "plot_position_similarity",
    "plot_rollout",
]
