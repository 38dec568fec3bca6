"""Studies: many runs (envs x seeds x settings) from one file, served by one master.

file.py reads and checks a study file into StudyRun records, each with the RunConfig it runs;
studydir.py keeps a study's directory: the file's copy, study.json (the runs and their state),
a run dir per run, and the rules a restarted study follows. Plain files and values: serving the
runs is the run room's business, which it gets as these records.
"""
