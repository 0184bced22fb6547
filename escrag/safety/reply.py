"""What the client reads when the check finds risk: ``safety_reply`` at high risk (a supportive opening
and where to get help now in ``safety.locale``), ``with_note`` at elevated risk (the model's reply, then
one gentle sentence naming where help is: ``safety.elevated_note``), and ``help_lines``."""

from __future__ import annotations

from escrag.safety.types import RiskAssessment

HELP = {  # locale -> (crisis line, emergency number, abuse line, poison line)
    "international": ("a local crisis line (findahelpline.com lists free, confidential lines in most countries)",
                      "your local emergency services (112 from any mobile phone in many countries, 911 in North "
                      "America, 999 in the UK, 000 in Australia)",
                      "a local domestic-violence helpline (findahelpline.com lists them)",
                      "a poison control centre"),
    "us": ("the 988 Suicide & Crisis Lifeline (call or text 988)", "911",
           "the National Domestic Violence Hotline (1-800-799-7233, or text START to 88788)",
           "Poison Control (1-800-222-1222)"),
    "uk": ("Samaritans (call 116 123, free, day or night) or text SHOUT to 85258", "999",
           "the National Domestic Abuse Helpline (0808 2000 247)", "NHS 111"),
    "ie": ("Samaritans (call 116 123) or text HELLO to 50808", "112 or 999",
           "Women's Aid (1800 341 900)", "the Poisons Information Centre (01 809 2166)"),
    "ca": ("the 9-8-8 Suicide Crisis Helpline (call or text 988)", "911",
           "a local shelter or crisis line (211 can connect you)", "your provincial poison centre"),
    "au": ("Lifeline (13 11 14, or text 0477 13 11 14)", "000", "1800RESPECT (1800 737 737)",
           "the Poisons Information Centre (13 11 26)"),
    "eu": ("a crisis line (116 123 in many EU countries)", "112",
           "a domestic-violence helpline (116 016 in many EU countries)", "a poison control centre"),
}

OPENING = {
    "suicide": "I'm really glad you told me this, and I'm worried about your safety right now. You don't "
               "have to carry this alone.",
    "self_harm": "Thank you for telling me. I'm concerned about how badly you may be hurt, and you deserve "
                 "care right now.",
    "harm_to_others": "I can hear how much anger and pain you're holding. I'm worried someone could get hurt, "
                      "including you.",
    "abuse": "I'm so sorry this is happening. What you're describing is dangerous, and it is not your fault.",
    "medical": "I'm worried about you. What you're describing can be a medical emergency.",
}


def help_lines(categories: list[str], sc) -> str:
    """Where to get help now, for the categories found, in ``sc.locale`` (or ``sc.help_text``)."""
    if sc.help_text:
        return sc.help_text
    crisis, emergency, abuse, poison = HELP[sc.locale]
    cats = set(categories) or {"suicide"}
    lines = []
    if cats & {"medical", "self_harm"} or "suicide" in cats:
        lines.append(f"If you are in danger or have already hurt yourself or taken something, please call "
                     f"{emergency} now" + (f" or {poison}" if "medical" in cats else "") + ".")
    if cats & {"suicide", "self_harm"}:
        lines.append(f"You can also reach {crisis} right now; they are there to listen.")
    if "abuse" in cats:
        lines.append(f"If you are in danger, please call {emergency} now, and when it is safe, {abuse} can help "
                     f"you plan what to do next.")
    if "harm_to_others" in cats:
        lines.append(f"Please put some distance between you and that person and anything you could use, and call "
                     f"{emergency} or {crisis} now.")
    return " ".join(lines)


def safety_reply(reply: str, assessment: RiskAssessment, sc) -> str:
    """At high risk: a supportive opening, where to get help now in the configured locale, and an
    invitation to keep talking (the policy's own text stays in ``escrag.output``). Otherwise ``reply``."""
    if assessment.level != "high":
        return reply
    cats = assessment.categories or ["suicide"]
    opening = OPENING[cats[0]]
    return f"{opening} {help_lines(cats, sc)} I'm here with you, and we can keep talking while you reach out."


def elevated_note(sc) -> str:
    """One gentle sentence naming where help is, in ``sc.locale`` (or ``sc.help_text``)."""
    opening = "If things ever feel like too much, you don't have to face them alone"
    if sc.help_text:
        return f"{opening}. {sc.help_text}"
    return f"{opening}: {HELP[sc.locale][0]} is there to listen, any time."


def with_note(reply: str, assessment: RiskAssessment, sc) -> str:
    """``reply`` followed by ``elevated_note`` at elevated risk when ``sc.elevated_note`` is on; else ``reply``."""
    if assessment.level != "elevated" or not sc.elevated_note:
        return reply
    return f"{reply.rstrip()}\n\n{elevated_note(sc)}"
