"""The chi-square p-value every losslessness test uses: its Monte Carlo tail agrees with the chi-square tail where
the asymptotics hold, and replaces it near alpha where they do not (cells expected ~10 times, as in the law tests)."""

import numpy as np
import torch
from scipy import stats

from stats_util import _simulated_tail, chi_square_pvalue


def test_the_simulated_tail_is_the_chi_square_tail_where_every_cell_is_expected_often():
    expected = np.full(10, 1000.0)
    statistic = stats.chi2.isf(0.005, df=9)
    assert abs(_simulated_tail(statistic, expected) - 0.005) < 0.0008  # 200,000 draws: standard error 1.6e-4


def test_near_alpha_with_cells_expected_few_times_the_p_value_is_the_simulated_tail():
    law = torch.tensor([0.2, 0.1] + [0.7 / 140] * 140, dtype=torch.float64)  # 2,000 samples: 140 cells expected 10
    expected = law.numpy() * 2000
    counts = np.round(expected).astype(int)
    counts[[2, 3]] += 32  # two rare cells 3.2x over, the common one under: a tail event
    counts[0] -= 64
    pvalue = chi_square_pvalue(torch.from_numpy(np.repeat(np.arange(law.numel()), counts)), law)
    chi_square = stats.chisquare(counts, expected)
    assert pvalue == _simulated_tail(chi_square.statistic, expected)
    assert pvalue > 1.5 * chi_square.pvalue  # the chi-square tail, too light here, would fail this sample at 1e-4
    all_in_one_cell = torch.zeros(2000, dtype=torch.long)  # far off: the chi-square tail stands
    assert chi_square_pvalue(all_in_one_cell, law) < 1e-12
