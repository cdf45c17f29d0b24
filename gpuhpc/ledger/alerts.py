"""Budget alerts to PIs: a mail or a webhook when a quota's usage reaches 80 % and 100 % of its
budget (``gpuhpc ledger alerts``, run by cron), as ColdFront's and XDMoD's users expect them.

* **Who**: each account has one contact (``gpuhpc ledger account set --contact``): ``mailto:`` one
  or more addresses, or an ``https://`` webhook (``http://`` only to this machine: a local
  relay). The contacts are admins only (a webhook URL often holds a secret token); a user quota's
  alerts go to its account's contact.
* **When**: each quota has thresholds in percent of its budget (``gpuhpc quota set --alert-at``;
  default 80 and 100). A threshold is reached when the quota's *settled* usage in its current
  period or window (charges, adjustments included: what ``gpuhpc quota show`` calls used, not
  the holds of jobs still running) is at least that share of the budget. Each threshold of each
  measure (money, GPU-hours) is sent once per period per quota: the ``quota_alerts`` row is
  claimed in one transaction (the quota rows locked, so two cron runs never both claim it), the
  mail or POST goes out after the commit (no network call inside a transaction), and a second
  transaction marks it sent or failed; a failed one, or one whose run died while sending, is
  tried again by the next run. Thresholds reached together go out as one message naming the
  highest.
* **How**: a webhook gets an HTTP POST of one JSON object (:func:`payload`; ``text`` holds the
  message, as Slack and Mattermost read it) through urllib, never a shell, without following
  redirects. A mail goes through the site config's ``[ledger] alert_mail`` (``smtp://host:port``,
  default ``smtp://localhost:25``, or ``sendmail``: ``sendmail -t -oi`` from an argv, no shell)
  from ``[ledger] alert_from``.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import ipaddress
import json
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from decimal import Decimal
from email.message import EmailMessage

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.ledger import admin, audit, budget, db, periods, pricing
from gpuhpc.ledger.orm import Account, AlertContact, Quota, QuotaAlert, utcnow

DEFAULT_THRESHOLDS = (80, 100)
MAX_THRESHOLD = 1000
CONTACT_FIELD = "--contact"
THRESHOLD_FIELD = "--alert-at"
RETRY_SENDING_AFTER = dt.timedelta(minutes=15)     # a claim whose run died is sent again after this
TIMEOUT_S = 20
EVENT = "gpuhpc.budget_alert"
_ADDRESS = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                      r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+")


# ------------------------------------------------------------------ settings an admin types
def thresholds_arg(text: str | None, field: str = THRESHOLD_FIELD) -> str:
    """``80,100`` / ``50, 90 ,100`` -> the stored text (sorted, each once); ``none`` or ``""`` -> ``""``
    (no alerts). A UserInputError naming ``field`` for anything else."""
    raw = str(text if text is not None else "").strip()
    if raw.lower() in ("", "none", "off"):
        return ""
    parts = [p.strip() for p in raw.split(",")]
    if not all(p.isdigit() and p.isascii() and 1 <= int(p) <= MAX_THRESHOLD for p in parts):
        raise UserInputError(f"{raw!r} is not a list of percentages", field=field,
                             hint=f"whole numbers from 1 to {MAX_THRESHOLD}, comma-separated, e.g. 80,100; "
                                  "none for no alerts")
    return ",".join(str(n) for n in sorted({int(p) for p in parts}))


def thresholds_of(stored: str | None) -> tuple[int, ...]:
    """A quota's thresholds: its ``alert_at`` (NULL: the default 80, 100; ``""``: none)."""
    if stored is None:
        return DEFAULT_THRESHOLDS
    return tuple(int(p) for p in stored.split(",") if p.strip().isdigit())


def _loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def contact_arg(text: str | None, field: str = CONTACT_FIELD) -> str:
    """A contact as typed: ``mailto:pi@example.org`` (several: ``mailto:a@x.org,b@x.org``) or an
    ``https://`` URL (``http://`` only to localhost); ``""`` clears it. Returns it as stored; a
    UserInputError naming ``field`` otherwise (control characters and blanks refused)."""
    raw = str(text if text is not None else "").strip(" ")
    if raw == "":
        return ""
    hint = "mailto:pi@example.org or https://hooks.example.org/... ('' clears it)"
    if len(raw) > 1024 or any(ord(c) < 33 or ord(c) == 127 for c in raw):
        raise UserInputError("a contact has no blanks or control characters and at most 1024 characters",
                             field=field, hint=hint)
    if raw.lower().startswith("mailto:"):
        addrs = raw[len("mailto:"):].split(",")
        if not all(_ADDRESS.fullmatch(a) for a in addrs):
            raise UserInputError(f"{raw!r} is not a mailto: with mail addresses", field=field, hint=hint)
        return "mailto:" + ",".join(addrs)
    try:
        u = urllib.parse.urlsplit(raw)
        host = u.hostname or ""
        u.port                                  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise UserInputError(f"{raw!r} is not a URL", field=field, hint=hint) from None
    if u.scheme == "https" and host:
        return raw
    if u.scheme == "http" and host and _loopback(host):
        return raw
    if u.scheme == "http" and host:
        raise UserInputError("a webhook outside this machine must be https", field=field, hint=hint)
    raise UserInputError(f"{raw!r} is neither mailto: nor an https:// URL", field=field, hint=hint)


def shown(contact: str) -> str:
    """A contact as printed and audited: a webhook's path and query (where tokens live) hidden."""
    if contact.startswith("mailto:") or not contact:
        return contact
    u = urllib.parse.urlsplit(contact)
    return f"{u.scheme}://{u.hostname}{f':{u.port}' if u.port else ''}/..."


# ------------------------------------------------------------------ the admin's changes
def set_contact(account: str, contact: str, *, url: str | None = None) -> bool:
    """Set (``""``: clear) an account's contact; audited (a webhook's path hidden). True when it changed."""
    contact = contact_arg(contact)
    with db.session_scope(url) as s:
        a = s.scalar(select(Account).where(Account.name == account))
        if a is None:
            raise GpuhpcError(f"no account {account!r}", hint=f"gpuhpc ledger account add {account}")
        row = s.get(AlertContact, a.id)
        before = row.contact if row is not None else ""
        if contact == before:
            return False
        if not contact:
            s.delete(row)
        elif row is None:
            s.add(AlertContact(account_id=a.id, contact=contact, updated_by=audit.actor(s), updated_at=utcnow()))
        else:
            row.contact, row.updated_by, row.updated_at = contact, audit.actor(s), utcnow()
        audit.record(s, "account.contact", f"account {account}", {"contact": shown(before)},
                     {"contact": shown(contact)})
        return True


def contacts(*, url: str | None = None) -> dict[str, str]:
    """account -> contact (admins only)."""
    with db.session_scope(url) as s:
        return {name: c for name, c in s.execute(
            select(Account.name, AlertContact.contact).join(AlertContact, AlertContact.account_id == Account.id))}


def set_thresholds(account: str, alert_at: str, *, user: str | None = None, url: str | None = None,
                   cluster: str | None = None) -> bool:
    """Set a quota's thresholds (:func:`thresholds_arg`'s text); audited. True when they changed.
    ``cluster``: that cluster's quota (None: the one for every cluster)."""
    alert_at = thresholds_arg(alert_at)
    with db.session_scope(url) as s:
        stmt = select(Quota).join(Account, Account.id == Quota.account_id).where(Account.name == account)
        qs = [q for q in s.scalars(stmt) if (q.user.name if q.user is not None else None) == user
              and q.cluster == (cluster or None)]
        if not qs:
            who = f"account {account}" + (f" user {user}" if user else "")
            raise GpuhpcError(f"no quota for {who}", hint="set one first: gpuhpc quota set ACCOUNT --money M")
        q = qs[0]
        before = ",".join(map(str, thresholds_of(q.alert_at)))
        if q.alert_at == alert_at:
            return False
        q.alert_at = alert_at
        audit.record(s, "quota.alerts", f"account {account}" + (f" user {user}" if user else ""),
                     {"alert_at": before}, {"alert_at": alert_at or "none"})
        return True


# ------------------------------------------------------------------ what is due
@dataclasses.dataclass
class Alert:
    """One message: a quota's measure reached ``threshold`` (the highest of ``thresholds``)."""

    quota_id: int
    account: str
    user: str | None
    grant: str | None
    cost_centre: str | None
    period: str
    period_start: dt.datetime
    period_end: dt.datetime | None
    label: str
    measure: str                      # money | gpu_hours
    thresholds: tuple[int, ...]
    used: Decimal
    budget: Decimal
    contact: str
    status: str = "due"               # due | sent | failed
    error: str = ""

    @property
    def threshold(self) -> int:
        return max(self.thresholds)

    @property
    def percent(self) -> Decimal:
        return pricing.to_decimal(self.used * 100 / self.budget)

    @property
    def message(self) -> str:
        who = f"account {self.account}" if self.user is None else f"user {self.user} in account {self.account}"
        what = "money budget" if self.measure == "money" else "GPU-hour budget"
        unit = "" if self.measure == "money" else " GPU-hours"
        return (f"{who} has used {self.percent:.0f}% of its {what} for {self.label}: {self.used:,.2f}{unit} of "
                f"{self.budget:,.2f}{unit} (alert at {self.threshold}%)")

    def as_dict(self) -> dict:
        return {"account": self.account, "user": self.user, "period": self.period, "label": self.label,
                "period_start": self.period_start.isoformat(),
                "period_end": None if self.period_end is None else self.period_end.isoformat(),
                "measure": self.measure, "threshold": self.threshold, "thresholds": list(self.thresholds),
                "used": str(self.used), "budget": str(self.budget), "percent": str(self.percent),
                "contact": shown(self.contact), "status": self.status, "error": self.error, "message": self.message}


def payload(a: Alert) -> dict:
    """The JSON object a webhook receives."""
    return {"event": EVENT, "text": a.message, "message": a.message, "account": a.account, "user": a.user,
            "grant": a.grant, "cost_centre": a.cost_centre, "period": a.period, "period_label": a.label,
            "period_start": a.period_start.isoformat(),
            "period_end": None if a.period_end is None else a.period_end.isoformat(),
            "measure": a.measure, "threshold": a.threshold, "used": str(a.used), "budget": str(a.budget),
            "percent": str(a.percent)}


def _due(s: Session, now: dt.datetime, tz: dt.tzinfo, account: str | None) -> list[Alert]:
    """Alerts due now (the quota rows locked: call inside the transaction that claims them)."""
    stale = now - RETRY_SENDING_AFTER
    where = {r.account_id: r.contact for r in s.scalars(select(AlertContact))}
    out = []
    stmt = select(Quota).join(Account, Account.id == Quota.account_id).order_by(Quota.id)
    if account:
        stmt = stmt.where(Account.name == account)
    for q in list(s.scalars(stmt.with_for_update(of=Quota))):
        contact, marks = where.get(q.account_id), thresholds_of(q.alert_at)
        if not contact or not marks:
            continue
        b = admin.bucket(s, q, now)
        done = {(r.measure, r.threshold) for r in s.scalars(select(QuotaAlert).where(
            QuotaAlert.quota_id == q.id, QuotaAlert.period_start == b.period_start))
            if r.status == "sent" or (r.status == "sending" and r.updated_at > stale)}
        period = q.period.value
        start = b.period_start
        end = periods.period_end(period, start, tz)
        for measure, budget_, used in (("money", q.money, b.used_money), ("gpu_hours", q.gpu_hours,
                                                                          b.used_gpu_hours)):
            if budget_ is None or budget_ <= 0:
                continue
            reached = tuple(t for t in marks if used * 100 >= budget_ * t and (measure, t) not in done)
            if reached:
                out.append(Alert(q.id, q.account.name, q.user.name if q.user is not None else None,
                                 q.account.grant_code, q.account.cost_centre, period, start, end,
                                 budget.period_label(period, start.astimezone(tz)), measure, reached,
                                 Decimal(used), Decimal(budget_), contact))
    return out


def claim(s: Session, alerts: list[Alert], now: dt.datetime) -> None:
    """Mark ``alerts`` as being sent (``quota_alerts`` rows ``sending``), in :func:`run`'s transaction."""
    for a in alerts:
        for t in a.thresholds:
            r = s.scalar(select(QuotaAlert).where(QuotaAlert.quota_id == a.quota_id,
                                                  QuotaAlert.period_start == a.period_start,
                                                  QuotaAlert.measure == a.measure, QuotaAlert.threshold == t))
            if r is None:
                r = QuotaAlert(quota_id=a.quota_id, period_start=a.period_start, measure=a.measure, threshold=t,
                               attempts=0, created_at=now)
                s.add(r)
            r.used, r.budget, r.contact, r.status = a.used, a.budget, a.contact, "sending"
            r.attempts = (r.attempts or 0) + 1
            r.detail, r.updated_at = "", now


def _mark(alerts: list[Alert], url: str | None) -> None:
    now = utcnow()
    with db.session_scope(url) as s:
        for a in alerts:
            for r in s.scalars(select(QuotaAlert).where(QuotaAlert.quota_id == a.quota_id,
                                                        QuotaAlert.period_start == a.period_start,
                                                        QuotaAlert.measure == a.measure,
                                                        QuotaAlert.threshold.in_(a.thresholds))):
                r.status, r.detail, r.updated_at = a.status, a.error[:2000], now
                if a.status == "sent":
                    r.sent_at = now


# ------------------------------------------------------------------ sending
class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001
        return None                          # a 3xx is an error: the payload goes where it was set to only


def post_webhook(target: str, body: dict, timeout: float = TIMEOUT_S) -> None:
    """POST ``body`` as JSON to ``target`` (a contact_arg-checked URL); GpuhpcError on failure."""
    req = urllib.request.Request(target, data=json.dumps(body, sort_keys=True).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "gpuhpc-ledger-alerts"})
    try:
        with urllib.request.build_opener(_NoRedirect).open(req, timeout=timeout) as resp:
            resp.read(65536)
    except urllib.error.HTTPError as exc:
        raise GpuhpcError(f"webhook {shown(target)} answered HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise GpuhpcError(f"webhook {shown(target)}: {exc}") from None


def mail_settings() -> tuple[str, str]:
    """(``[ledger] alert_mail``, ``[ledger] alert_from``): how and from whom mail goes."""
    from gpuhpc.config import site_setting

    how = (site_setting("ledger", "alert_mail") or "smtp://localhost:25").strip()
    sender = (site_setting("ledger", "alert_from") or "").strip() or f"gpuhpc@{socket.getfqdn()}"
    if not _ADDRESS.fullmatch(sender):
        raise UserInputError(f"{sender!r} is not a mail address", field="ledger.alert_from",
                             hint="the site config's [ledger] alert_from, e.g. hpc-accounting@example.org")
    return how, sender


def build_mail(a: Alert, sender: str) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = ", ".join(a.contact[len("mailto:"):].split(","))
    msg["Subject"] = f"gpuhpc budget: {a.message.split(':', 1)[0]}"     # folded when long (the policy's)
    lines = [a.message, "", f"account: {a.account}"]
    lines += [f"user: {a.user}"] if a.user else []
    lines += [f"grant: {a.grant}"] if a.grant else []
    lines += [f"cost centre: {a.cost_centre}"] if a.cost_centre else []
    lines += [f"period: {a.label} ({a.period})",
              f"used: {a.used:,.2f} of {a.budget:,.2f} ({'money' if a.measure == 'money' else 'GPU-hours'})", "",
              "Usage is what has been charged so far (jobs still running are not counted until they end).",
              "See it with: gpuhpc quota show " + a.account]
    msg.set_content("\n".join(lines) + "\n")
    return msg


def send_mail(msg: EmailMessage, how: str, timeout: float = TIMEOUT_S) -> None:
    """Send through ``smtp://host:port`` or the local ``sendmail`` (an argv, no shell)."""
    if how == "sendmail" or how.startswith("sendmail:"):
        import shutil
        import subprocess

        prog = how.partition(":")[2] or shutil.which("sendmail", path="/usr/sbin:/usr/lib:/usr/bin:/bin")
        if not prog:
            raise GpuhpcError("no sendmail program on this machine", hint="set [ledger] alert_mail = "
                                                                         '"smtp://HOST:PORT" in the site config')
        try:
            res = subprocess.run([prog, "-t", "-oi"], input=msg.as_bytes(), capture_output=True, timeout=timeout,
                                 check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GpuhpcError(f"sendmail: {exc}") from None
        if res.returncode != 0:
            raise GpuhpcError(f"sendmail exited {res.returncode}: "
                              f"{res.stderr.decode(errors='replace').strip()[-200:]}")
        return
    u = urllib.parse.urlsplit(how)
    if u.scheme != "smtp" or not u.hostname:
        raise UserInputError(f"{how!r} is neither smtp://HOST:PORT nor sendmail", field="ledger.alert_mail",
                             hint='the site config\'s [ledger] alert_mail, e.g. "smtp://localhost:25"')
    import smtplib

    try:
        with smtplib.SMTP(u.hostname, u.port or 25, timeout=timeout) as smtp:
            smtp.send_message(msg)
    except (OSError, smtplib.SMTPException) as exc:
        raise GpuhpcError(f"mail through {u.hostname}:{u.port or 25}: {exc}") from None


def send(a: Alert, mail: tuple[str, str] | None = None) -> None:
    """Send one alert to its contact; GpuhpcError when it did not go out."""
    if a.contact.startswith("mailto:"):
        how, sender = mail or mail_settings()
        send_mail(build_mail(a, sender), how)
    else:
        post_webhook(a.contact, payload(a))


# ------------------------------------------------------------------ the cron job
def run(*, url: str | None = None, now: dt.datetime | None = None, dry_run: bool = False,
        account: str | None = None) -> list[Alert]:
    """Send every alert that is due (``dry_run``: list them, claim and send nothing). Returns them,
    each ``sent`` or ``failed`` (with its error), or ``due`` in a dry run."""
    now = now or utcnow()
    tz = periods.ledger_zone()
    mail = None
    with db.session_scope(url) as s:
        due = _due(s, now, tz, account)
        if due and any(a.contact.startswith("mailto:") for a in due):
            mail = mail_settings()                 # a bad setting: exit 2 before anything is claimed
        if not dry_run:
            claim(s, due, now)
    if dry_run:
        return due
    for a in due:
        try:
            send(a, mail)
            a.status = "sent"
        except GpuhpcError as exc:
            a.status, a.error = "failed", exc.one_line()
    if due:
        _mark(due, url)
    return due
