"""The retrieval query of an lm-evaluation-harness request: the instance's own example, not its few-shot block.

lm-eval hands a model each request's whole context (the task's description, its few-shot examples with their
answers, then the instance's own text) and the instance's `doc`. Retrieving with the whole context would find
passages for the shots as much as for the question, so REPLUG retrieves with the instance's own text: the task's
`doc_to_text(doc)`, as the project's OLMES path retrieves with the question block (jobs' `olmes_requests`).

    queries = QueryResolver("doc_to_text", include_path=["/my/tasks"])
    queries(instance)        # -> "Question: What is ...?\\nAnswer:" (the task's own prompt for this doc)

Sources (the model's `query=` argument):
  * "doc_to_text" (default): the task's doc_to_text of the instance's doc, the task found by its name through
    lm-eval's `TaskManager` (the include paths first, then lm-eval's own tasks: about 20 s, once);
  * "field:NAME": the doc's own field NAME (e.g. "field:question");
  * "context": the request's whole context, few-shot block included (a plain REPLUG LM's query).
"""
from __future__ import annotations

import warnings

SOURCES = ("doc_to_text", "field:NAME", "context")


class QueryResolver:
    """Callable: an lm-eval `Instance` -> its retrieval query (module docstring)."""

    def __init__(self, source: str = "doc_to_text", include_path=()):
        if source not in ("doc_to_text", "context") and not (source.startswith("field:") and source[6:]):
            raise ValueError(f"query={source!r}: use one of {', '.join(SOURCES)}")
        self.source = source
        self.include_path = [p for p in ([include_path] if isinstance(include_path, str) else include_path) if p]
        self._tasks: dict = {}  # task name -> lm-eval Task
        self._shots: dict = {}  # task name -> [(a few-shot doc's text, its query)]
        self._managers: dict = {}  # include lm-eval's own tasks? -> TaskManager
        self._warned: set = set()

    def __call__(self, instance) -> str:
        context = instance.args[0]
        if self.source == "context":
            return context
        if self.source.startswith("field:"):
            name = self.source[6:]
            value = (instance.doc or {}).get(name)
            if not isinstance(value, str) or not value.strip():
                found = f"no field {name!r}" if value is None else f"{name!r} = {repr(value)[:60]}"
                raise ValueError(f"query={self.source!r}: the doc of {instance.task_name!r} #{instance.doc_id} has "
                                 f"{found} (its fields: {', '.join(sorted(instance.doc or {}))})")
            return value
        text = self._task(instance.task_name).doc_to_text(instance.doc)
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"the task {instance.task_name!r} gives no text of its own for a doc (doc_to_text: "
                             f"{text!r}): pass query=field:NAME (a field of its docs) or query=context")
        if text not in context and instance.task_name not in self._warned:
            self._warned.add(instance.task_name)
            warnings.warn(f"{instance.task_name}: the example's own text (doc_to_text) is not in the request's "
                          "context (a chat template or another prompt?); retrieval still queries with it",
                          stacklevel=2)
        return text

    def own_text(self, instance) -> str:
        """The instance's own example as its task writes it (`doc_to_text`), whatever the query source."""
        text = self._task(instance.task_name).doc_to_text(instance.doc)
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"the task {instance.task_name!r} gives no text of its own for a doc (doc_to_text: "
                             f"{text!r}), so there is no example to put a passage beside: use passages=context")
        return text

    def shots(self, task_name: str) -> list[tuple[str, str]]:
        """(its text, its retrieval query) for each of the task's few-shot docs (`fewshot_docs`), computed once: the
        query as this source takes it from a doc (the field NAME's value; the text itself for doc_to_text and
        context)."""
        if task_name not in self._shots:
            task, out = self._task(task_name), []
            for doc in task.fewshot_docs() or []:
                text = task.doc_to_text(doc)
                if not isinstance(text, str) or not text.strip():
                    continue
                query = doc.get(self.source[6:]) if self.source.startswith("field:") else text
                out.append((text, query if isinstance(query, str) and query.strip() else text))
            self._shots[task_name] = out
        return self._shots[task_name]

    def _task(self, name: str):
        """The lm-eval Task named `name`: from the include paths alone first (fast), then with lm-eval's own."""
        if name not in self._tasks:
            from lm_eval.tasks import TaskManager

            task = None
            for defaults in ((False, True) if self.include_path else (True,)):
                if defaults not in self._managers:  # each built once: lm-eval's own index takes about 20 s
                    self._managers[defaults] = TaskManager(include_path=self.include_path or None,
                                                           include_defaults=defaults)
                manager = self._managers[defaults]
                if name in manager.all_tasks:
                    task = manager.load([name])["tasks"].get(name)
                    break
            if task is None:
                raise ValueError(f"no lm-eval task {name!r} to read the example's own text from (include paths: "
                                 f"{self.include_path or 'none'}): pass include_path=, or query=field:NAME / "
                                 "query=context")
            self._tasks[name] = task
        return self._tasks[name]
