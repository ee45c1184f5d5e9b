"""What a run gives back, and how it is shown.

``result`` holds the data (``RunResult``, ``EpisodeResult``, ``StepEvent``: fields,
JSON and trajectories) and imports nothing of presentation; ``stats`` the
statistics over it; ``summary`` the one table of summary rows that the text
summary and the HTML report both print; ``report`` the plots and the HTML page;
``record`` what a run records of its episodes; ``video`` their frames and files.
"""
