"""bert_jax.retrieval.metrics against sentence-transformers' InformationRetrievalEvaluator on the
same embeddings: random ones, exact ties, and queries with 0-3 relevant documents; ranked lists
shorter than the relevant documents (`ranked_scores`)."""

import numpy as np
import pytest

from bert_jax.retrieval.metrics import ranked_scores, retrieval_scores


def evaluator_metrics(
    queries: np.ndarray,
    corpus: np.ndarray,
    relevant,
    corpus_ids=None,
    recall_at=(1, 10),
    chunk_size: int = 7,
) -> dict[str, float]:
    """sentence-transformers' InformationRetrievalEvaluator's cosine nDCG@10, MRR@10 and
    Recall@k (`recall_at`) on these embeddings: query ids are row numbers, corpus ids
    `corpus_ids` (default row numbers), `relevant` {query row: set of corpus ids}."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("sentence_transformers")
    from sentence_transformers.evaluation import InformationRetrievalEvaluator
    from sentence_transformers.util import cos_sim

    class Embedded:  # the evaluator encodes the queries through the model it is given
        def encode_query(self, sentences, **kwargs):
            return torch.from_numpy(queries[[int(s) for s in sentences]])

    corpus_ids = range(len(corpus)) if corpus_ids is None else corpus_ids
    evaluator = InformationRetrievalEvaluator(
        queries={i: str(i) for i in range(len(queries))},
        corpus={c: str(c) for c in corpus_ids},
        relevant_docs=relevant,
        score_functions={"cosine": cos_sim},
        precision_recall_at_k=list(recall_at),
        corpus_chunk_size=chunk_size,  # several chunks: ties across chunk boundaries too
        show_progress_bar=False,
    )
    scores = evaluator.compute_all_metrics(Embedded(), corpus_embeddings=torch.from_numpy(corpus))
    cosine = scores["cosine"]
    recalls = {f"recall@{k}": cosine["recall@k"][k] for k in recall_at}
    return {"ndcg@10": cosine["ndcg@k"][10], "mrr@10": cosine["mrr@k"][10], **recalls}


def _relevant(rng, num_queries: int, num_docs: int) -> list[set[int]]:
    sizes = rng.integers(0, 4, num_queries)  # 0: left out of every mean, as there
    sizes[0] = 1
    return [set(rng.choice(num_docs, size, replace=False).tolist()) for size in sizes]


@pytest.mark.torch
@pytest.mark.parametrize("ties", ["none", "duplicates", "all_equal"])
def test_scores_equal_information_retrieval_evaluator(ties):
    rng = np.random.default_rng({"none": 0, "duplicates": 1, "all_equal": 2}[ties])
    queries = rng.normal(size=(23, 8)).astype(np.float32)
    corpus = rng.normal(size=(31, 8)).astype(np.float32)
    if ties == "duplicates":  # equal scores: the earlier row ranks first, across chunks too
        corpus[[5, 12, 20, 29]] = corpus[3]
        corpus[[9, 17]] = corpus[1] * 3.0
        queries[4] = corpus[3]
    elif ties == "all_equal":  # every score ties: the ranking is the corpus order
        corpus[:] = corpus[0]
    relevant = _relevant(rng, len(queries), len(corpus))
    ours = retrieval_scores(queries, corpus, relevant)
    assert list(ours) == ["ndcg@10", "mrr@10", "recall@1", "recall@10"]
    theirs = evaluator_metrics(queries, corpus, dict(enumerate(relevant)))
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value, abs=1e-12), key
    assert 0.0 < ours["ndcg@10"] < 1.0


def test_a_perfect_ranking_scores_one_and_bad_inputs_are_named():
    emb = np.eye(12, dtype=np.float32)
    scores = retrieval_scores(emb, emb, [{i} for i in range(12)])
    assert scores == {"ndcg@10": 1.0, "mrr@10": 1.0, "recall@1": 1.0, "recall@10": 1.0}
    with pytest.raises(ValueError, match=r"relevant documents \[12\] outside the corpus of 12"):
        retrieval_scores(emb, emb, [{12}] * 12)
    with pytest.raises(ValueError, match="11 relevant sets for 12 queries"):
        retrieval_scores(emb, emb, [{0}] * 11)
    with pytest.raises(ValueError, match="no query has a relevant document"):
        retrieval_scores(emb, emb, [set()] * 12)
    with pytest.raises(ValueError, match=r"\[Q, E\] and \[N, E\]"):
        retrieval_scores(emb, emb[:, :5], [{0}] * 12)


def test_ranked_lists_shorter_than_the_relevant_documents():
    """A query with 5 relevant documents, 3 retrieved (a corpus of 3, or relevant documents
    outside it): its ideal DCG counts all 5 up to rank 10, as the evaluator's does."""
    hits = np.array([[True, False, True], [False, False, False]])
    scores = ranked_scores(hits, np.array([5, 1]), recall_at=(1, 100))
    ideal = sum(1 / np.log2(r + 2) for r in range(5))
    assert scores["ndcg@10"] == pytest.approx((1 + 1 / np.log2(4)) / ideal / 2)
    assert scores["mrr@10"] == 0.5
    assert scores["recall@1"] == pytest.approx(0.1) and scores["recall@100"] == pytest.approx(0.2)
