"""Django's template engine rendering a page in a loop, as a view does (no server, no database): ``html_view``
renders a table through ``Template.render``, whose time is all in its nodes (``ForNode.render``, the variables'
filters), next to nothing in itself. Prints "ready" once Django is set up, then renders for SECONDS."""
import sys
import time

import django
from django.conf import settings

settings.configure(TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates"}], USE_I18N=False)
django.setup()

from django.template import Context, Template  # noqa: E402 (needs the settings)

PAGE = Template("<table>{% for row in rows %}<tr>{% for cell in row %}<td>{{ cell|upper }}</td>{% endfor %}</tr>"
                "{% endfor %}</table>")


def html_view(rows):
    return PAGE.render(Context({"rows": rows}))


def main(seconds):
    rows = [["cell %d.%d" % (i, j) for j in range(10)] for i in range(50)]
    print("ready", flush=True)
    until = time.time() + seconds
    while time.time() < until:
        html_view(rows)


if __name__ == "__main__":
    main(float(sys.argv[1]))
