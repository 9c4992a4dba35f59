"""Presidio's analyzer REST API, served from the real `presidio-analyzer`
package without a spaCy model, for the end-to-end tests
(tests/harness/presidio.rs starts it).

Usage: python presidio_server.py PORT (it listens on 127.0.0.1:PORT and
prints a line once it does; `GET /health` answers from then on).

The package on PyPI does not ship the REST server (presidio-analyzer/app.py
in github.com/microsoft/presidio, a Flask app run by gunicorn in the
`mcr.microsoft.com/presidio-analyzer` image). This is that app's `/health`,
`/analyze`, `/recognizers` and `/supportedentities` on the standard
library's http.server, answering as it does: the same request fields
(`AnalyzerRequest`; `text` may be a list, answered with a list of lists),
the same JSON (each `RecognizerResult.to_dict()`, `recognition_metadata`
removed, keys sorted: `analysis_explanation` null, `end`, `entity_type`,
`score`, `start`, offsets in characters), the same errors (`{"error":
...}`: 400 for a request `analyze()` cannot take, 500 for anything else,
such as "No text provided" or a body that is not JSON). Requests are served
one at a time, as by the image's single gunicorn sync worker.

The engine is built as the image builds it (`AnalyzerEngineProvider` with
the package's default.yaml, default_analyzer.yaml and
default_recognizers.yaml: every predefined recognizer and the lemma context
enhancer), except for the model its NLP engine loads: the image has spaCy's
`en_core_web_lg` (a 400 MB download from GitHub); here presidio's own
`SpacyNlpEngine` runs over `spacy.blank(lang)`, which tokenizes and finds
no named entities. So PERSON, LOCATION, NRP and the NER side of DATE_TIME
are never found; what patterns and checksums find (EMAIL_ADDRESS,
PHONE_NUMBER, CREDIT_CARD, IBAN_CODE, IP_ADDRESS, US_SSN, URL, ...) is, at
the same offsets. A blank pipeline has no lemmatizer (spaCy's English one
needs the spacy-lookups-data tables), so each token's lemma is its lower
case. Context words ("phone", "card", "license") match lemmas as
substrings, so "phones" still counts for "phone": scores differ from the
model's only where a lemma is irregular ("men" for "man"). Stop words are
spaCy's own in both (so "call", one of them, never counts as context).

One more difference: the e-mail recognizer's domain check (tldextract) uses
the Public Suffix List the package ships instead of fetching it.
"""

import json
import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import presidio_analyzer
import spacy
import tldextract
import tldextract.tldextract
from presidio_analyzer import AnalyzerEngine, AnalyzerEngineProvider, AnalyzerRequest, BatchAnalyzerEngine
from presidio_analyzer.nlp_engine import NlpEngine, NlpEngineProvider, SpacyNlpEngine
from spacy.language import Language

CONF = Path(presidio_analyzer.__file__).parent / "conf"
# What the image's Dockerfile sets NLP_CONF_FILE, ANALYZER_CONF_FILE and
# RECOGNIZER_REGISTRY_CONF_FILE to.
NLP_CONF_FILE = CONF / "default.yaml"
ANALYZER_CONF_FILE = CONF / "default_analyzer.yaml"
RECOGNIZER_REGISTRY_CONF_FILE = CONF / "default_recognizers.yaml"
# The image's BATCH_SIZE default.
BATCH_SIZE = 500

logger = logging.getLogger("presidio-analyzer")

INTERNAL_SERVER_ERROR = (
    "The server encountered an internal error and was unable to complete your request. "
    "Either the server is overloaded or there is an error in the application."
)

NOT_FOUND = (
    "The requested URL was not found on the server. "
    "If you entered the URL manually please check your spelling and try again."
)


class NotJson(Exception):
    """The request is not JSON (werkzeug's BadRequest or UnsupportedMediaType)."""


# EmailRecognizer validates domains with `tldextract.extract`, whose default
# extractor fetches the Public Suffix List from publicsuffix.org (and caches
# it in ~/.cache) before falling back to the list the package ships: use
# that list, and touch neither the network nor the home directory.
tldextract.tldextract.TLD_EXTRACTOR = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


@Language.component("lower_case_lemma")
def lower_case_lemma(doc):
    """Each token's lemma is its lower case (a blank pipeline sets none)."""
    for token in doc:
        token.lemma_ = token.lower_
    return doc


class BlankSpacyNlpEngine(SpacyNlpEngine):
    """Presidio's spaCy engine, each configured model replaced by
    `spacy.blank(lang_code)`: tokens, no entities, and nothing downloaded."""

    def load(self) -> None:
        self.nlp = {}
        for model in self.models:
            nlp = spacy.blank(model["lang_code"])
            nlp.add_pipe("lower_case_lemma")
            self.nlp[model["lang_code"]] = nlp


class Provider(AnalyzerEngineProvider):
    """The image's engine, but for the models its NLP engine loads."""

    def _load_nlp_engine(self) -> NlpEngine:
        # The image's NLP engine (spaCy, with its NER configuration) and
        # models, as presidio's provider builds it, with the blank engine
        # standing for spaCy's.
        return NlpEngineProvider(nlp_engines=(BlankSpacyNlpEngine,), conf_file=NLP_CONF_FILE).create_engine()


def build_engine() -> AnalyzerEngine:
    return Provider(
        analyzer_engine_conf_file=ANALYZER_CONF_FILE,
        recognizer_registry_conf_file=RECOGNIZER_REGISTRY_CONF_FILE,
    ).create_engine()


def _exclude_attributes_from_dto(recognizer_result_list):
    # As app.py does.
    for result in recognizer_result_list:
        if hasattr(result, "recognition_metadata"):
            delattr(result, "recognition_metadata")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "presidio-analyzer-test"
    engine: AnalyzerEngine
    batch_engine: BatchAnalyzerEngine
    # The image runs one gunicorn sync worker: one request at a time.
    lock = threading.Lock()

    def log_message(self, format, *args):
        logger.info("%s %s", self.address_string(), format % args)

    def send(self, status: int, body: str, content_type: str = "application/json") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_json(self, status: int, value) -> None:
        # Flask's jsonify: compact JSON and a newline.
        self.send(status, json.dumps(value, separators=(",", ":")) + "\n")

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def route(self, method: str):
        path, _, query = self.path.partition("?")
        routes = {
            "/health": ("GET", self.health),
            "/analyze": ("POST", self.analyze),
            "/recognizers": ("GET", lambda: self.recognizers(query)),
            "/supportedentities": ("GET", lambda: self.supported_entities(query)),
        }
        if path not in routes:
            self.send_json(404, {"error": NOT_FOUND})
        elif routes[path][0] != method:
            self.send_json(405, {"error": "The method is not allowed for the requested URL."})
        else:
            with self.lock:
                routes[path][1]()

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        body = self.read_body()
        self.request_body = body
        self.route("POST")

    def get_json(self):
        """Flask's `request.get_json()`: a JSON content type and body."""
        mimetype = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if not (mimetype == "application/json" or (mimetype.startswith("application/") and mimetype.endswith("+json"))):
            raise NotJson()
        try:
            return json.loads(self.request_body)
        except ValueError:
            raise NotJson() from None

    def health(self):
        self.send(200, "Presidio Analyzer service is up", "text/html; charset=utf-8")

    def analyze(self):
        try:
            req_data = AnalyzerRequest(self.get_json())
            if not req_data.text:
                raise Exception("No text provided")

            batch_request = isinstance(req_data.text, list)
            batch = req_data.text if batch_request else [req_data.text]

            if not req_data.language:
                raise Exception("No language provided")
            else:
                self.engine.get_supported_entities(req_data.language)

            iterator = self.batch_engine.analyze_iterator(
                texts=batch,
                batch_size=min(len(batch), BATCH_SIZE),
                language=req_data.language,
                correlation_id=req_data.correlation_id,
                score_threshold=req_data.score_threshold,
                entities=req_data.entities,
                return_decision_process=req_data.return_decision_process,
                ad_hoc_recognizers=req_data.ad_hoc_recognizers,
                context=req_data.context,
                allow_list=req_data.allow_list,
                allow_list_match=req_data.allow_list_match,
                regex_flags=req_data.regex_flags,
                n_process=1,
            )
            results = []
            for recognizer_result_list in iterator:
                _exclude_attributes_from_dto(recognizer_result_list)
                results.append(recognizer_result_list)
            body = json.dumps(results if batch_request else results[0], default=lambda o: o.to_dict(), sort_keys=True)
            self.send(200, body)
        except TypeError as te:
            error_msg = f"Failed to parse /analyze request for AnalyzerEngine.analyze(). {te.args[0]}"
            logger.error(error_msg)
            self.send_json(400, {"error": error_msg})
        except NotJson:
            # app.py's handler reads `e.args[0]` of werkzeug's BadRequest or
            # UnsupportedMediaType, which has no args: the IndexError is
            # Flask's InternalServerError, which its HTTPException handler
            # answers.
            self.send_json(500, {"error": INTERNAL_SERVER_ERROR})
        except Exception as e:
            logger.error(f"A fatal error occurred during execution of AnalyzerEngine.analyze(). {e}")
            self.send_json(500, {"error": _message(e)})

    def recognizers(self, query: str):
        language = _query_arg(query, "language")
        try:
            names = [o.name for o in self.engine.get_recognizers(language)]
            self.send_json(200, names)
        except Exception as e:
            self.send_json(500, {"error": _message(e)})

    def supported_entities(self, query: str):
        language = _query_arg(query, "language")
        try:
            self.send_json(200, self.engine.get_supported_entities(language))
        except Exception as e:
            self.send_json(500, {"error": _message(e)})


def _message(e: Exception):
    """app.py's `e.args[0]`; without args, that IndexError is a 500 with
    Flask's InternalServerError's description."""
    return e.args[0] if e.args else INTERNAL_SERVER_ERROR


def _query_arg(query: str, name: str):
    values = parse_qs(query).get(name)
    return values[0] if values else None


def main():
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s - %(name)s - %(levelname)s - %(message)s")
    port = int(sys.argv[1])
    engine = build_engine()
    Handler.engine = engine
    Handler.batch_engine = BatchAnalyzerEngine(engine)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"presidio analyzer listening on 127.0.0.1:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
