; placement-logic proof obligation: composition/single-tensor-rules
; theorem: Composition
; single: tensor: composition rules CR01–CR08 hold (2 plans)
;   for each of the 2 compositions P in the family: CR01(P) ∧ … ∧ CR08(P), for all mesh sizes
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun cr07_T_microbatches () Int)
(declare-fun cr07_t_microbatches () Int)
(declare-fun size_microbatches () Int)
(declare-fun cr07_agree_microbatches () Bool)
(declare-fun size_x () Int)
(assert
 (let (($x0 (and false)))
(let ((?x0 (to_real 1)))
(let ((?x1 (+ (to_real cr07_t_microbatches) (to_real cr07_T_microbatches))))
(let (($x1 (or false (and (distinct (* (* 1.0 ?x0) ?x1) (* ?x1 ?x0)) true))))
(let (($x2 (= cr07_T_microbatches (* cr07_t_microbatches (- size_microbatches 1)))))
(let (($x3 (>= cr07_t_microbatches 1)))
(let (($x4 (= size_microbatches 1)))
(let (($x5 (=> $x4 cr07_agree_microbatches)))
(let (($x6 (or $x0 $x0 $x0 $x0 $x0 (and (and false (>= size_microbatches 2))) (and $x5 $x3 $x2 $x1) $x0)))
(let (($x7 (>= size_microbatches 1)))
(let (($x8 (>= size_x 1)))
(let (($x9 (and $x8 $x7 $x6)))
(or $x9 $x9))))))))))))))
(check-sat)
(exit)
