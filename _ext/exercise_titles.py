"""Sphinx extension: the titles of sphinx-exercise's exercises are translatable messages.

sphinx-exercise builds an exercise's title from the directive's argument (```{exercise} Split heads```)
as a subtitle without a source or raw text, which Sphinx's i18n treats as a built-in message: the
gettext builder does not extract it and the Chinese edition shows it in English. Here the `exercise`
(and `exercise-start`) directive wraps the title's text in an inline node marked translatable, with
its source, line and raw text, so that `make locale` puts each title in its page's catalogue and the
Locale transform translates it like any paragraph.

A solution's title ("Solution to Exercise 3 (Split heads)") is built at write time from the copy of
the exercise that sphinx-exercise keeps in its registry, made before the translation: after reading
a page, that copy gets the translated title too.
"""

from __future__ import annotations

from docutils import nodes
from sphinx_exercise.directive import ExerciseDirective, ExerciseStartDirective
from sphinx_exercise.nodes import exercise_enumerable_node, exercise_node, exercise_subtitle, exercise_title


def _subtitle(exercise: nodes.Element) -> exercise_subtitle | None:
    title = exercise.children[0] if exercise.children else None
    if isinstance(title, exercise_title) and len(title.children) > 1:
        return title.children[1] if isinstance(title.children[1], exercise_subtitle) else None
    return None


def _translatable(directive: type[ExerciseDirective]) -> type[ExerciseDirective]:
    class Translatable(directive):
        def run(self) -> list[nodes.Node]:
            result = super().run()
            for node in result:
                subtitle = _subtitle(node)
                if subtitle is not None and self.arguments:
                    # The msgid is the title as written, markup included. The inline stays in the title
                    # that sphinx-exercise assembles after reading, where the gettext builder looks.
                    text = nodes.inline(self.arguments[0], "", *subtitle.children, translatable=True)
                    text.source, text.line = self.get_source_info()
                    subtitle.children = []
                    subtitle += text
            return result

    Translatable.__name__ = f"Translatable{directive.__name__}"
    return Translatable


def _update_registry(app, doctree: nodes.document) -> None:
    """Give sphinx-exercise's copy of each exercise of this page the page's (translated) title."""
    registry = getattr(app.env, "sphinx_exercise_registry", {})
    for node in doctree.findall(lambda n: isinstance(n, (exercise_node, exercise_enumerable_node))):
        entry = registry.get(node.get("label"))
        if entry is None or entry.get("docname") != app.env.docname:
            continue
        translated, kept = _subtitle(node), _subtitle(entry["node"])
        if translated is not None and kept is not None:
            kept.replace_self(translated.deepcopy())


def setup(app):
    app.setup_extension("sphinx_exercise")
    for directive in (ExerciseDirective, ExerciseStartDirective):
        app.add_directive(directive.name, _translatable(directive), override=True)
    app.connect("doctree-read", _update_registry)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
