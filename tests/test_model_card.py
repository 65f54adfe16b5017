"""pipeline.model_card's page, from a card's content (the pipeline test checks the content)."""

from pipeline import model_card


def _card(**data):
    return {
        "model_name": "fmnist", "version": 3, "blessing": "blessed: every threshold of the Evaluator passed",
        "data": {"source": "TFDS fashion_mnist_local", "split_counts_before_dedup": {"train": 54063},
                 "split_counts": {"train": 53922, "eval": 5937},
                 "dedup_removed_by_reference": {"test": 86, "eval": 70},
                 "dedup_removed_total": 141, "bad_records_skipped": {}, **data},
        "model": {"name": "FMNIST-ViT", "config": {"hidden_size": 64}, "params": 141066, "macs": 8_100_000},
        "training": {"recipe": {"learning_rate": 0.003}, "steps": 800, "batch_size": 256,
                     "precision": "mixed_bfloat16", "train_seconds": 150.0},
        "evaluation": {"split": "eval",
                       "metrics": {"sparse_categorical_accuracy": 0.8567, "example_count": 5937.0},
                       "per_class": {"coat": {"accuracy": 0.8, "examples": 600},
                                     "bag": {"accuracy": None, "examples": 0}}},
        "code_digest": "96940aee442e20a1",
        "mlmd": {"artifacts": {"model": 9}, "executions": {"ImageExampleGen": 1, "ServingPusher": 11}},
    }


def test_the_page_gives_the_total_removed_though_one_image_may_copy_two_splits():
    page = model_card.markdown(_card())
    assert page.startswith("# fmnist version 3\n")
    assert "| train | 53,922 | 54,063 |" in page and "| eval | 5,937 | 5,937 |" in page
    assert "Dedup removed 141 training images (86 copying test images, 70 copying eval images)." in page
    assert "Left out as undecodable: none." in page
    assert "| sparse_categorical_accuracy | 0.8567 |" in page and "| example_count | 5,937 |" in page
    assert "| coat | 0.8000 | 600 |" in page and "| bag | - | 0 |" in page
    assert "ML Metadata executions: ImageExampleGen 1, ServingPusher 11." in page


def test_the_page_counts_bad_records_and_says_when_executions_are_unknown():
    card = _card(bad_records_skipped={"train": 4})
    card["mlmd"]["executions"] = {}
    page = model_card.markdown(card)
    assert "Left out as undecodable: 4 in train." in page
    assert "ML Metadata executions: not known for this orchestrator." in page
