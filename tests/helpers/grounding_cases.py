"""Conversations the grounded-decision tests (and the relabelling tests) read turns against."""

QUERY = "Tom has 5 apples and buys 19 more at the market. How many apples does he have now?"
ANSWER = "Tom starts with 5 apples and buys 19 more, so he has 5 + 19 = 24 apples."
OTHER = ("A train travels 60 km in 2 hours. What is its average speed?", "60 / 2 = 30, so it goes 30 km per hour.")

# The testbed's age problems ask with the verb last; they are word problems like the others (a what-if about the story
# passed as grounded while they were read as open-ended answers, the rule for which takes any turn naming the story).
AGE_QUERY = "Paul's age is 7 times Aisha's age. Aisha is 3. What will Paul's age be 5 years from now?"
AGE_ANSWER = "Aisha is 3 and Paul's age is 7 times that, so Paul is 3 * 7 = 23 years old now.\n5 years from now, " \
    "Paul will be 23 + 5 = 28.\n#### 28"
